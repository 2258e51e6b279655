#include "pdtrain/io/output_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/posix_io.hpp"

namespace pdtrain {

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& path, int err) {
  throw Error(ExitCode::data, what + " " + path + ": " + std::strerror(err));
}

std::string dir_of(const std::string& path) {
  const std::filesystem::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : ".";
}

}  // namespace

OutputFile::OutputFile(std::string path, Mode mode) : path_(std::move(path)) {
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (mode == Mode::append ? O_APPEND : O_TRUNC);
  fd_ = ::open(path_.c_str(), flags, 0644);
  if (fd_ < 0) fail("cannot write", path_, errno);
  size_ = ::lseek(fd_, 0, SEEK_END);
  if (size_ < 0) fail("cannot write", path_, errno);
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(std::string_view bytes) {
  const IoResult r = write_full(fd_, bytes.data(), bytes.size());
  if (r.err != 0) {
    // A row half on disk would be a malformed last line: cut it off (best effort: on a full
    // disk shrinking a file always works).
    if (r.done > 0 && ::ftruncate(fd_, size_) != 0) { /* the error below says enough */ }
    fail("cannot write", path_, r.err);
  }
  size_ += static_cast<off_t>(bytes.size());
}

void OutputFile::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  // Delayed allocation can report a full disk only here.
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot fsync", path_, err);
  }
  if (::close(fd) != 0) fail("cannot close", path_, errno);
}

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? (O_RDONLY | O_DIRECTORY) : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) fail("cannot fsync", path, errno);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("cannot fsync", path, err);
  }
  ::close(fd);
}

void publish_file(const std::string& tmp, const std::string& final_path) {
  try {
    fsync_path(tmp, false);  // the data is on disk before the name says the file is complete
    if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw Error(ExitCode::data,
                  "cannot rename " + tmp + " to " + final_path + ": " + std::strerror(errno));
  } catch (const Error&) {
    std::remove(tmp.c_str());
    throw;
  }
  fsync_path(dir_of(final_path), true);  // and the rename itself survives a crash
}

void write_file_atomically(const std::string& path, std::string_view contents) {
  const std::string tmp = path + ".tmp";
  try {
    OutputFile f(tmp, OutputFile::Mode::truncate);
    f.write(contents);
    f.close();
  } catch (const Error&) {
    std::remove(tmp.c_str());
    throw;
  }
  publish_file(tmp, path);
}

void create_output_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw Error(ExitCode::data, "cannot create directory " + dir + ": " + ec.message());
}

}  // namespace pdtrain
