#include "files.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "format.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/io/output_file.hpp"

namespace fs = std::filesystem;

namespace pdtrain::ckpt {

std::string checkpoint_file_name(std::int64_t step) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld.h5", static_cast<long long>(step));
  return buf;
}

namespace detail {

std::int64_t step_of_file_name(const std::string& name) {
  constexpr std::size_t kPrefix = 5, kSuffix = 3;  // "ckpt-", ".h5"
  if (name.size() <= kPrefix + kSuffix || name.compare(0, kPrefix, "ckpt-") != 0 ||
      name.compare(name.size() - kSuffix, kSuffix, ".h5") != 0)
    return -1;
  const std::string digits = name.substr(kPrefix, name.size() - kPrefix - kSuffix);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return -1;
  return std::stoll(digits);
}

std::string dir_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

std::string base_of(const std::string& path) { return fs::path(path).filename().string(); }

namespace {

// What retention knows of checkpoint files without reading them again: those this process
// published (written from the state in memory, so known good) and those it verified, with
// why each damaged one does not verify.
class KnownFiles {
 public:
  static KnownFiles& get() {
    static KnownFiles k;
    return k;
  }
  void published(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    damage_[path] = "";
  }
  // "" when `path` verifies; verified once per process (a full read), then remembered.
  std::string damage(const std::string& path) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = damage_.find(path);
      if (it != damage_.end()) return it->second;
    }
    const std::string why = checkpoint_damage(path);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!why.empty())
      std::fprintf(stderr,
                   "pdtrain: warning: retention keeps a checkpoint that does not verify: %s\n",
                   why.c_str());
    return damage_[path] = why;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> damage_;  // by path; "" = good
};

}  // namespace

void publish(const std::string& tmp, const std::string& final_path) {
  publish_file(tmp, final_path);  // fsync, rename, fsync the directory; removes tmp on failure
  KnownFiles::get().published(final_path);
}

void write_latest(const std::string& dir, const std::string& name) {
  write_file_atomically(dir + "/latest", name + "\n");
}

std::optional<std::string> read_latest(const std::string& dir) {
  std::ifstream in(dir + "/latest");
  std::string name;
  if (!in || !std::getline(in, name) || name.empty()) return std::nullopt;
  return name;
}

std::vector<DirEntry> list_checkpoints(const std::string& dir) {
  std::vector<DirEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::int64_t step = step_of_file_name(name);
    if (step >= 0 && e.is_regular_file(ec)) out.push_back({name, step});
  }
  std::sort(out.begin(), out.end(),
            [](const DirEntry& a, const DirEntry& b) { return a.step > b.step; });
  return out;
}

std::vector<std::string> apply_retention(const std::string& dir, std::int64_t current_step,
                                         int keep) {
  std::vector<std::string> deleted;
  std::error_code ec;
  // Leftovers of writes that crashed before their rename.
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 7 && name.compare(name.size() - 7, 7, ".h5.tmp") == 0 &&
        name.compare(0, 5, "ckpt-") == 0 && fs::remove(e.path(), ec))
      deleted.push_back(name);
  }
  if (keep <= 0) return deleted;
  // Newer steps belong to an abandoned run (we restarted from an earlier checkpoint): they are
  // neither counted nor touched.
  std::vector<DirEntry> older;
  for (const DirEntry& e : list_checkpoints(dir))
    if (e.step <= current_step) older.push_back(e);
  // The newest `keep` that verify count; a file that does not verify is never deleted (nor is
  // what it names as its anchor): it may be the only copy of the progress, for a person to look
  // at. All are judged before anything is deleted, so a delta is verified with its anchor.
  std::set<std::string> needed;
  int good = 0;
  for (const DirEntry& e : older) {
    const std::string path = dir + "/" + e.name;
    const bool damaged = !KnownFiles::get().damage(path).empty();
    if (!damaged && good == keep) continue;
    if (!damaged) ++good;
    needed.insert(e.name);
    try {
      const CheckpointMeta m = read_meta(path);
      if (!m.anchor.empty()) needed.insert(m.anchor);
    } catch (const Error&) {
      // An unreadable kept file needs no anchor; it is kept so that a person can look at it.
    }
  }
  for (const DirEntry& e : older)
    if (!needed.count(e.name) && fs::remove(dir + "/" + e.name, ec)) deleted.push_back(e.name);
  return deleted;
}

}  // namespace detail
}  // namespace pdtrain::ckpt
