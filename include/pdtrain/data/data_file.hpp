#pragma once
// A data file read with pread(), checked on every read. Not a memory map: a file truncated
// while the job runs would kill every rank that touches a page past its end with SIGBUS,
// while a read comes up short and becomes an error naming the file. The page cache still
// shares the file between the ranks of a node; a sequence is a few KB, so one fstat and one
// pread per sequence cost nothing next to a training step.
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <string>

namespace pdtrain::data {

class DataFile {
 public:
  // Opens `path`; throws Error(ExitCode::data) naming the file when it does not exist or is
  // not a regular file (checked before opening, so a FIFO cannot block the open), or cannot
  // be opened.
  explicit DataFile(const std::string& path);
  ~DataFile();
  DataFile(DataFile&& other) noexcept;
  DataFile& operator=(DataFile&& other) noexcept;
  DataFile(const DataFile&) = delete;
  DataFile& operator=(const DataFile&) = delete;

  // Size when opened, in bytes.
  std::int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Reads bytes [offset, offset + n) into `out`. Throws Error(ExitCode::data) naming the file
  // when its size or modification time differs from when it was opened (it changed under the
  // running job) or the read fails or comes up short.
  void read(std::int64_t offset, std::size_t n, std::uint8_t* out) const;

 private:
  void check_unchanged() const;

  std::string path_;
  int fd_ = -1;
  std::int64_t size_ = 0;
  timespec mtime_{};
};

}  // namespace pdtrain::data
