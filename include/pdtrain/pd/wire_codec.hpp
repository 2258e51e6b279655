#pragma once
// Codecs for blocks on the wire. raw sends fp32 bytes; lz4 (fetch) and zstd (push) compress them
// losslessly; bf16 rounds to bfloat16 (round to nearest even), halving the bytes and changing
// the numerics (the run's header line says so).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pdtrain {

enum class WireCodec { raw, bf16, lz4, zstd };

std::optional<WireCodec> wire_codec_from_string(const std::string& name);
const char* to_string(WireCodec c);
inline bool is_lossy(WireCodec c) { return c == WireCodec::bf16; }

// Appends the encoding of n floats to `out`; returns its size in bytes.
std::size_t wire_encode(WireCodec c, const float* in, std::int64_t n, std::vector<char>& out);
// Decodes `bytes` bytes into exactly n floats; false if the payload is malformed.
bool wire_decode(WireCodec c, const char* in, std::size_t bytes, float* out, std::int64_t n);

}  // namespace pdtrain
