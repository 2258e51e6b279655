#include "pdtrain/data/data_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/posix_io.hpp"

namespace pdtrain::data {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error(ExitCode::data, path + ": " + what);
}

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

void require_regular(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode))
    fail(path, "is " + kind_of(st.st_mode) + ", not a regular file; data files must be regular files");
}

std::string errno_text() { return std::strerror(errno); }

}  // namespace

DataFile::DataFile(const std::string& path) : path_(path) {
  // stat first: opening a FIFO for reading blocks until a writer appears.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "cannot open data file: " + errno_text());
  require_regular(path, st);
  // Non-blocking too, in case the path was swapped for a FIFO between stat and open.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) fail(path, "cannot open data file: " + errno_text());
  // A throwing constructor runs no destructor: close the descriptor on the way out.
  struct CloseOnThrow {
    int& fd;
    bool armed = true;
    ~CloseOnThrow() {
      if (armed) ::close(std::exchange(fd, -1));
    }
  } guard{fd_};
  if (::fstat(fd_, &st) != 0) fail(path, "cannot stat: " + errno_text());
  require_regular(path, st);
  size_ = static_cast<std::int64_t>(st.st_size);
  mtime_ = st.st_mtim;
  guard.armed = false;
}

DataFile::~DataFile() {
  if (fd_ >= 0) ::close(fd_);
}

DataFile::DataFile(DataFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(std::exchange(other.size_, 0)),
      mtime_(other.mtime_) {}

DataFile& DataFile::operator=(DataFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = std::exchange(other.size_, 0);
    mtime_ = other.mtime_;
  }
  return *this;
}

void DataFile::check_unchanged() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(path_, "cannot stat: " + errno_text());
  const bool same_time = st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec;
  if (st.st_size == size_ && same_time) return;
  fail(path_, "the data file changed while the job was running (it was " + std::to_string(size_) +
                  " bytes, now " + std::to_string(st.st_size) + " bytes" +
                  (same_time ? "" : ", modified since it was opened") +
                  "); restart the run on a file that stays put");
}

void DataFile::read(std::int64_t offset, std::size_t n, std::uint8_t* out) const {
  check_unchanged();
  const IoResult r = pread_full(fd_, out, n, offset);
  const std::int64_t at = offset + static_cast<std::int64_t>(r.done);
  if (r.err != 0)
    fail(path_, "cannot read at byte " + std::to_string(at) + ": " + std::strerror(r.err));
  if (r.done < n)
    fail(path_, "the data file ends at byte " + std::to_string(at) + ", before the " +
                    std::to_string(n) + " bytes at offset " + std::to_string(offset) +
                    " (it was " + std::to_string(size_) + " bytes when opened)");
}

}  // namespace pdtrain::data
