#pragma once
// One run per directory. A run holds DIR/pdtrain.lock for its lifetime: an advisory fcntl
// lock (an open-file-description lock, so that no other open of the file in this process can
// drop it) on a file that names the holder (host, PID, its start time, the boot it belongs to,
// SLURM_JOB_ID, when it started). A second run finds the lock taken and refuses, naming the
// holder. A dead run's fcntl lock vanishes with its process, whichever host it ran on, so its
// leftover file is taken over with a notice; on this host a PID that no longer runs (or that
// belongs to another start time or boot) is dead too. Where the file system has no fcntl locks
// (ENOLCK, e.g. NFS without lockd) only the holder's own host can tell it is dead, and the
// requeued incarnation of the same Slurm job: a lock from another host is then refused, to be
// removed by hand. File systems whose locks are local to a node (Lustre mounted with
// localflock) cannot see a holder on another node at all: there, one run per directory is the
// user's job.
#include <memory>
#include <string>

namespace pdtrain {

class RunLock {
 public:
  // Takes `dir`/pdtrain.lock (the directory must exist). `key` names what `dir` is in the
  // deck ("run.out_dir") for messages. A lock held by a live run: Error(ExitCode::data)
  // naming the key, the directory and the holder's host and PID (and Slurm job). A stale lock
  // taken over: `notice` says whose it was and why it is dead ("" otherwise).
  static std::unique_ptr<RunLock> acquire(const std::string& dir, const std::string& key,
                                          std::string* notice);
  ~RunLock();  // empties the file and drops the lock
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;
  const std::string& path() const { return path_; }

 private:
  RunLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
};

}  // namespace pdtrain
