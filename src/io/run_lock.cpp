#include "pdtrain/io/run_lock.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/posix_io.hpp"

namespace pdtrain {

namespace {

// Who holds (or held) a lock, as its file says.
struct Holder {
  std::string host, boot, job, since;
  long pid = 0;
  long long start = 0;  // the process's start time, clock ticks after boot (/proc/PID/stat)
};

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The lock file's contents through its own descriptor: opening and closing the file again
// would drop a classic (non-OFD) fcntl lock of this process.
std::string read_fd(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return "";
  std::string text(static_cast<std::size_t>(st.st_size), '\0');
  text.resize(pread_full(fd, text.data(), text.size(), 0).done);
  return text;
}

// A process as /proc/PID/stat describes it: its state (field 3) and start time (field 22,
// clock ticks after boot), counted after the command name, which may hold spaces.
struct ProcStat {
  bool exists = false;
  char state = '?';
  long long start = 0;
};

ProcStat proc_stat(long pid) {
  const std::string stat = read_text("/proc/" + std::to_string(pid) + "/stat");
  ProcStat p;
  const std::size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return p;
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 3) p.state = field[0];
    if (i == 22) p.start = std::atoll(field.c_str());
  }
  p.exists = true;
  return p;
}

std::string this_host() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string boot_id() {
  std::string id = read_text("/proc/sys/kernel/random/boot_id");
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id.empty() ? "-" : id;
}

Holder this_process() {
  Holder h;
  h.host = this_host();
  h.boot = boot_id();
  h.pid = static_cast<long>(getpid());
  h.start = proc_stat(h.pid).start;
  const char* job = std::getenv("SLURM_JOB_ID");
  h.job = job && *job ? job : "-";
  char since[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  std::strftime(since, sizeof(since), "%Y-%m-%dT%H:%M:%SZ", &tm);
  h.since = since;
  return h;
}

// The file's one line: "host=H pid=P start=S boot=B job=J since=T".
std::string to_line(const Holder& h) {
  return "host=" + h.host + " pid=" + std::to_string(h.pid) + " start=" +
         std::to_string(h.start) + " boot=" + h.boot + " job=" + h.job + " since=" + h.since + "\n";
}

// Nothing when the file is empty (no run holds it, or a run is between creating and filling it).
bool parse(const std::string& text, Holder& h) {
  std::istringstream in(text);
  std::string field;
  bool any = false;
  while (in >> field) {
    const std::size_t eq = field.find('=');
    if (eq == std::string::npos) continue;
    const std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    any = true;
    if (k == "host") h.host = v;
    else if (k == "pid") h.pid = std::atol(v.c_str());
    else if (k == "start") h.start = std::atoll(v.c_str());
    else if (k == "boot") h.boot = v;
    else if (k == "job") h.job = v;
    else if (k == "since") h.since = v;
  }
  return any;
}

std::string describe(const Holder& h) {
  std::string s = "host " + h.host + ", pid " + std::to_string(h.pid);
  if (h.job != "-" && !h.job.empty()) s += " (Slurm job " + h.job + ")";
  if (!h.since.empty()) s += ", since " + h.since;
  return s;
}

// Whether `h` is a process that still runs on this host: the same boot, its PID exists, is
// not a zombie (a killed rank not yet reaped) and started at the same time (a PID is reused by
// processes that start later).
bool alive_here(const Holder& h, const Holder& me) {
  if (h.host != me.host || h.boot != me.boot || h.pid <= 0) return false;
  if (kill(static_cast<pid_t>(h.pid), 0) != 0 && errno != EPERM) return false;
  const ProcStat p = proc_stat(h.pid);
  if (!p.exists) return true;  // no /proc to ask: kill() says it exists
  if (p.state == 'Z' || p.state == 'X') return false;
  return h.start == 0 || p.start == h.start;
}

enum class Lock { taken, held_by_other, unsupported };

Lock try_lock(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
#ifdef F_OFD_SETLK
  const int cmd = F_OFD_SETLK;  // per open file: closing another fd of the file keeps it
#else
  const int cmd = F_SETLK;
#endif
  if (fcntl(fd, cmd, &fl) == 0) return Lock::taken;
  if (errno == EAGAIN || errno == EACCES) return Lock::held_by_other;
  return Lock::unsupported;  // ENOLCK, EINVAL, EOPNOTSUPP: a file system without locks
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw Error(ExitCode::data, what + " " + path + ": " + std::strerror(err));
}

// Whether a lock left by `old` (whose fcntl lock, if any, is gone) may be taken over; `why`
// says why its run is dead, or why it may still be alive.
bool stale(const Holder& old, const Holder& me, Lock got, std::string& why) {
  if (alive_here(old, me)) {
    why = "it still runs on this host, though the file system did not keep its lock";
    return false;
  }
  if (old.host == me.host) {
    why = old.boot != me.boot ? "this host has rebooted since" : "that process no longer runs";
    return true;
  }
  if (got == Lock::taken) {
    why = "its lock vanished with its process";
    return true;
  }
  if (old.job != "-" && old.job == me.job) {
    why = "this is Slurm job " + me.job + " requeued";
    return true;
  }
  why = "this file system has no fcntl locks, so a run on another host cannot be seen to have "
        "ended";
  return false;
}

// Why `key` `dir` cannot be used: `old` holds its lock (nullptr: a run that has not yet
// written its name), `why` says why it may be alive ("" when its fcntl lock is held).
std::string in_use(const std::string& key, const std::string& dir, const std::string& path,
                   const Holder* old, const std::string& why) {
  std::string s = key + " " + dir + " is in use by another run: " +
                  (old ? describe(*old) : "one that is starting");
  if (!why.empty()) s += " (" + why + ")";
  s += " (lock file " + path + "); wait for it to end or choose another " + key;
  if (!why.empty()) s += ", or remove " + path + " if that run is gone";
  return s;
}

// Writes this process's line into the lock file it holds.
void claim(int fd, const std::string& path, const Holder& me) {
  const std::string line = to_line(me);
  if (::ftruncate(fd, 0) != 0) fail("cannot write the lock file", path, errno);
  errno = 0;
  if (::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()))
    fail("cannot write the lock file", path, errno ? errno : ENOSPC);
  if (::fsync(fd) != 0) fail("cannot fsync the lock file", path, errno);
}

}  // namespace

std::unique_ptr<RunLock> RunLock::acquire(const std::string& dir, const std::string& key,
                                          std::string* notice) {
  const std::string path = dir + "/pdtrain.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create the lock file", path, errno);
  std::unique_ptr<RunLock> lock(new RunLock(path, fd));
  const Lock got = try_lock(fd);
  const Holder me = this_process();
  Holder old;
  const bool had_holder = parse(read_fd(fd), old);
  std::string why;
  if (got == Lock::held_by_other || (had_holder && !stale(old, me, got, why))) {
    lock->fd_ = -1;  // not ours: the holder's line stays
    ::close(fd);
    throw Error(ExitCode::data, in_use(key, dir, path, had_holder ? &old : nullptr, why));
  }
  *notice = had_holder ? key + " " + dir + ": taking over the lock of a run that is gone (" +
                             describe(old) + ": " + why + ")"
                       : "";
  claim(fd, path, me);
  return lock;
}

RunLock::~RunLock() {
  if (fd_ < 0) return;
  // An empty file is a free lock: the next run starts without a notice.
  if (::ftruncate(fd_, 0) == 0) ::fsync(fd_);
  ::close(fd_);
}

}  // namespace pdtrain
