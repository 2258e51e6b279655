#pragma once
// A read-only memory map of a whole file. Token shards can be hundreds of MB; mapping them
// lets the page cache share them between the ranks of one node instead of each rank holding
// a private copy.
#include <cstddef>
#include <cstdint>
#include <string>

namespace pdtrain::data {

class MappedFile {
 public:
  // Maps `path`; throws Error(ExitCode::data) naming the file when it cannot be opened,
  // is not a regular file, or cannot be mapped. An empty file maps to size() == 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;

  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace pdtrain::data
