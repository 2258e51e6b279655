#include "pdtrain/data/token_shard.hpp"

#include <array>
#include <cstdio>
#include <vector>

#include "pdtrain/core/error.hpp"

namespace pdtrain::data {
namespace {

void put_le32(std::vector<std::uint8_t>& buf, std::size_t at, std::uint32_t v) {
  for (int b = 0; b < 4; ++b) buf[at + b] = static_cast<std::uint8_t>(v >> (8 * b));
}

}  // namespace

void write_token_shard(const std::string& path, std::span<const std::uint16_t> tokens) {
  // Serialized byte by byte so the file is little-endian whatever the host is.
  std::vector<std::uint8_t> buf(kShardHeaderBytes + 2 * tokens.size(), 0);
  put_le32(buf, 0, static_cast<std::uint32_t>(kShardMagic));
  put_le32(buf, 4, static_cast<std::uint32_t>(kShardVersion));
  put_le32(buf, 8, static_cast<std::uint32_t>(tokens.size()));
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    buf[kShardHeaderBytes + 2 * i] = static_cast<std::uint8_t>(tokens[i]);
    buf[kShardHeaderBytes + 2 * i + 1] = static_cast<std::uint8_t>(tokens[i] >> 8);
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error(ExitCode::data, path + ": cannot create token shard");
  const bool ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
  if (std::fclose(f) != 0 || !ok) throw Error(ExitCode::data, path + ": cannot write token shard");
}

}  // namespace pdtrain::data
