#pragma once
// A fresh directory under /tmp for a test, removed with its contents at scope exit.
#include <stdlib.h>

#include <filesystem>
#include <string>

namespace pdtrain {

class ScratchDir {
 public:
  ScratchDir() {
    char tmpl[] = "/tmp/pdtrain-test-XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace pdtrain
