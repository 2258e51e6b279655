#pragma once
// Every file pdtrain writes goes through these, so that no write error passes unseen: a failed
// write, flush, fsync, close or rename throws Error(ExitCode::data) naming the path and the
// cause ("cannot write runs/x/metrics.csv: No space left on device"), and nothing already on
// disk is lost. A whole file is written to PATH.tmp, fsync'ed and renamed over PATH
// (write_file_atomically); a file that grows row by row (metrics.csv) is an OutputFile, whose
// failed append is cut back to the last whole row.
#include <sys/types.h>

#include <string>
#include <string_view>

namespace pdtrain {

// An open file written with write(2) and checked at every call.
class OutputFile {
 public:
  enum class Mode { truncate, append };
  OutputFile(std::string path, Mode mode);
  ~OutputFile();  // closes without reporting: call close() to learn of errors
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Writes all of `bytes` or throws; a partial write (a full disk) is cut off again, so the
  // file ends where the previous write ended.
  void write(std::string_view bytes);
  // fsync(2), then close(2); throws naming the path if either fails.
  void close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  off_t size_ = 0;  // the end of the last complete write
};

// fsync of a file or a directory; throws Error(data) naming the path.
void fsync_path(const std::string& path, bool directory);
// Makes `tmp` durable and gives it its final name: fsync(tmp), rename, fsync(the directory).
// Throws Error(data) naming both paths; `tmp` is removed if the rename did not happen.
void publish_file(const std::string& tmp, const std::string& final_path);
// PATH := contents, all or nothing: PATH.tmp written, fsync'ed and renamed over PATH. On any
// failure PATH is untouched, PATH.tmp removed, and Error(data) names the file and the cause.
void write_file_atomically(const std::string& path, std::string_view contents);
// create_directories, or Error(data) naming the directory.
void create_output_directory(const std::string& dir);

}  // namespace pdtrain
