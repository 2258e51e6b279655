#pragma once
// llm.c token shards: a header of 256 little-endian int32 ([0] magic 20240520, [1] version 1,
// [2] token count, the rest zero) followed by the tokens as little-endian uint16.
#include <cstdint>
#include <span>
#include <string>

namespace pdtrain::data {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::int32_t kShardVersion = 1;
inline constexpr std::int64_t kShardHeaderInts = 256;
inline constexpr std::int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// Writes a version-1 shard (tests, small tools). Throws Error(ExitCode::data) naming the file
// when it cannot be written.
void write_token_shard(const std::string& path, std::span<const std::uint16_t> tokens);

}  // namespace pdtrain::data
