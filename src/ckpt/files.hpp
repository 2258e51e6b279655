#pragma once
// The checkpoint directory: `latest`, listing and retention (private); files are made durable
// and renamed into place by io/output_file (publish_file). Only holder 0 calls these.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pdtrain::ckpt::detail {

// Makes `tmp` the checkpoint `final_path` (io/output_file's publish_file: fsync, rename, fsync
// of the directory); retention then knows the file as good without reading it.
void publish(const std::string& tmp, const std::string& final_path);
// <dir>/latest := name, atomically (io/output_file's write_file_atomically: latest.tmp written,
// fsync'ed, renamed; Error(data) naming the file if it cannot).
void write_latest(const std::string& dir, const std::string& name);
std::optional<std::string> read_latest(const std::string& dir);

struct DirEntry {
  std::string name;  // "ckpt-00000100.h5"
  std::int64_t step;
};
// Complete-named checkpoints (ckpt-<step>.h5) in `dir`, newest step first.
std::vector<DirEntry> list_checkpoints(const std::string& dir);

// Deletes checkpoints of steps <= current_step beyond the newest `keep` that verify (and the
// anchors those need), and leftover *.h5.tmp files of crashed writes; never a checkpoint that
// does not verify (files this process published count as verified; others are read in full
// once per process). Returns the names deleted.
std::vector<std::string> apply_retention(const std::string& dir, std::int64_t current_step,
                                         int keep);

}  // namespace pdtrain::ckpt::detail
