#pragma once
// Checkpoint codecs and their element-level primitives (shared by the writer, the reader and
// the tests, so "what the file means" is defined in one place).
//
//   raw       fp32, chunked, no filter
//   zstd      fp32 through HDF5's shuffle filter and the zstd filter (id 32015); lossless
//   xor       every fp32's bit pattern XOR the anchor's, then shuffle + zstd; lossless
//   bitdelta  params as BitDelta (Liu et al. 2024): per block, one sign bit per weight and one
//             fp32 scale = mean |param - anchor|, decoded as anchor + scale * sign (sign of 0
//             is +); Adam m and v as xor. Lossy for params only.
//
// xor and bitdelta files are deltas against the last full ("anchor") checkpoint, which is
// always written lossless with zstd.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace pdtrain::ckpt {

enum class Codec { raw, zstd, xor_delta, bitdelta };

// "raw", "zstd", "xor", "bitdelta".
const char* codec_name(Codec c);
std::optional<Codec> codec_from_string(std::string_view s);
// Like codec_from_string, but throws Error(ExitCode::deck) listing the valid names.
Codec parse_codec(std::string_view s);
// True for codecs whose files need an anchor file to decode.
inline bool is_delta(Codec c) { return c == Codec::xor_delta || c == Codec::bitdelta; }

// out[i] = bits(value[i]) XOR bits(anchor[i]). The same call decodes (XOR is an involution).
void xor_bits(const std::uint32_t* value, const std::uint32_t* anchor, std::uint32_t* out,
              std::size_t n);

// Bytes of a packed sign array for n weights.
inline std::size_t sign_bytes(std::size_t n) { return (n + 7) / 8; }

// BitDelta encoding of one block: bit i of signs (LSB first within a byte) is 1 where
// param[i] - anchor[i] < 0; returns the scale, mean |param - anchor| accumulated in double in
// element order and rounded to fp32. `signs` must hold sign_bytes(n) bytes.
float bitdelta_encode(const float* param, const float* anchor, std::size_t n, std::uint8_t* signs);
// out[i] = anchor[i] + scale * (bit i ? -1 : +1), in fp32 (the exact decode the reader uses).
void bitdelta_decode(const float* anchor, const std::uint8_t* signs, float scale, std::size_t n,
                     float* out);

// HDF5's shuffle filter, forward direction, byte for byte: for elements of `elem` bytes, all
// first bytes, then all second bytes, ...; a trailing partial element is copied unchanged.
// Like HDF5, leaves the data as is when elem <= 1 or there is at most one element.
void shuffle_bytes(const void* in, std::size_t nbytes, std::size_t elem, void* out);

}  // namespace pdtrain::ckpt
