#include "pdtrain/interop/llmc_tokenizer.hpp"

#include <fstream>
#include <iterator>

#include "pdtrain/core/error.hpp"

namespace pdtrain {
namespace {

constexpr std::uint32_t kTokenizerMagic = 20240328;

std::uint32_t le32(const std::string& b, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(b[at + i]);
  return v;
}

}  // namespace

LlmcTokenizer::LlmcTokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ExitCode::data, path + ": cannot read the tokenizer file");
  const std::string b{std::istreambuf_iterator<char>(in), {}};
  auto bad = [&](const std::string& what) { throw Error(ExitCode::data, path + ": " + what); };
  if (b.size() < 1024) bad("shorter than an llm.c tokenizer's 1024-byte header");
  if (le32(b, 0) != kTokenizerMagic) bad("not an llm.c tokenizer file (wrong magic)");
  const std::uint32_t version = le32(b, 4), n = le32(b, 8);
  if (version != 1 && version != 2) bad("unsupported tokenizer version " + std::to_string(version));
  if (n == 0 || n > (1u << 24)) bad("vocabulary size " + std::to_string(n) + " is implausible");
  if (version == 2) eot_ = static_cast<std::int32_t>(le32(b, 12));
  std::size_t at = 1024;
  tokens_.reserve(n);
  for (std::uint32_t t = 0; t < n; ++t) {
    if (at >= b.size()) bad("truncated at token " + std::to_string(t) + " of " + std::to_string(n));
    const std::size_t len = static_cast<unsigned char>(b[at++]);
    if (len == 0 || at + len > b.size()) bad("token " + std::to_string(t) + " is cut off or empty");
    tokens_.push_back(b.substr(at, len));
    at += len;
  }
}

const std::string& LlmcTokenizer::decode(std::int32_t token) const {
  static const std::string none;
  return token >= 0 && token < size() ? tokens_[static_cast<std::size_t>(token)] : none;
}

}  // namespace pdtrain
