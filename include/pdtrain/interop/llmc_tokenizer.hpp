#pragma once
// llm.c's GPT-2 tokenizer file (gpt2_tokenizer.bin, written by llm.c's data scripts): 256
// little-endian uint32 [0] magic 20240328, [1] version (1, or 2 with [3] the end-of-text
// token), [2] vocabulary size; then per token one byte of length and that many bytes. pdtrain
// decodes with it (token ids to text); it does not encode.
#include <cstdint>
#include <string>
#include <vector>

namespace pdtrain {

class LlmcTokenizer {
 public:
  // Error(ExitCode::data) naming the file for anything but a complete tokenizer file.
  explicit LlmcTokenizer(const std::string& path);
  std::int64_t size() const { return static_cast<std::int64_t>(tokens_.size()); }
  // The token's bytes; "" for a token outside the vocabulary.
  const std::string& decode(std::int32_t token) const;
  // The end-of-text token (version 2 files), or -1.
  std::int32_t eot() const { return eot_; }

 private:
  std::vector<std::string> tokens_;
  std::int32_t eot_ = -1;
};

}  // namespace pdtrain
