#pragma once
// Checkpoint codecs and their element-level primitives (shared by the writer, the reader and
// the tests, so "what the file means" is defined in one place).
//
//   raw       fp32, chunked, no filter
//   zstd      fp32 through HDF5's shuffle filter and the zstd filter (id 32015); lossless
//   xor       every fp32's bit pattern XOR the anchor's, then shuffle + zstd; lossless
//   bitdelta  lossy (issue 16): params as a k-bit delta to the anchor (k = 1: BitDelta, Liu et
//             al. 2024, sign x mean |delta|; k >= 2: uniform levels between the delta's min and
//             max), Adam m as k-bit linear levels, Adam v as k-bit levels of its bit pattern
//             (the log domain), all with a scale pair per group of kQuantGroup values; or m
//             and v as lossless xor (moment bits 0).
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

// ---- bitdelta quantization (docs/checkpoint-format.md, "BitDelta")

// Values per quantization group: each group of a block has its own pair of scale words.
constexpr std::size_t kQuantGroup = 256;
inline std::size_t quant_groups(std::size_t n) { return (n + kQuantGroup - 1) / kQuantGroup; }
// Bytes of n codes of `bits` bits, packed LSB first (code i starts at bit i * bits).
inline std::size_t code_bytes(std::size_t n, int bits) {
  return (n * static_cast<std::size_t>(bits) + 7) / 8;
}

// How a state's values become codes:
//   delta   x - ref (the anchor's value), linear levels; 1 bit: sign x mean |x - ref|
//   linear  x itself, linear levels (2..8 bits)
//   log     x >= 0 through its fp32 bit pattern, which is monotone and piecewise linear in
//           log2 x: code 0 is exactly 0, codes 1.. are levels between the group's least and
//           largest positive pattern, decoded in integer arithmetic (2..8 bits)
enum class Quantizer { delta, linear, log };

// The bit widths of a bitdelta file: params 1..8, moments 0 (lossless xor) or 2..8.
struct BitDeltaBits {
  int params = 4;
  int moments = 6;
  friend bool operator==(const BitDeltaBits&, const BitDeltaBits&) = default;
};

// How a bitdelta file stores state k (0 params, 1 adam_m, 2 adam_v): quantized as `q` with
// `bits` bits, or (nullopt) exactly, as xor against the anchor. Other codecs: always exact.
struct StateQuant {
  Quantizer q;
  int bits;
};
std::optional<StateQuant> state_quant(Codec c, const BitDeltaBits& b, int k);

// Encodes n values x (ref: the anchor's values, for delta only) into `codes`
// (code_bytes(n, bits) bytes) and `scales` (2 * quant_groups(n) words), writes the exact
// decode into `decoded`, and returns the largest error of the decode: |decoded - x| for delta
// and linear, |decoded - x| / x (0 where x = 0) for log. Throws Error(runtime) for a value the
// quantizer cannot represent (not finite; negative for log).
float quantize(Quantizer q, int bits, const float* x, const float* ref, std::size_t n,
               std::uint8_t* codes, std::uint32_t* scales, float* decoded);
// The decode the reader uses: out[i] from the codes and scales (and ref for delta), in fp32.
void dequantize(Quantizer q, int bits, const std::uint8_t* codes, const std::uint32_t* scales,
                const float* ref, std::size_t n, float* out);

// HDF5's shuffle filter, forward direction, byte for byte: for elements of `elem` bytes, all
// first bytes, then all second bytes, ...; a trailing partial element is copied unchanged.
// Like HDF5, leaves the data as is when elem <= 1 or there is at most one element.
void shuffle_bytes(const void* in, std::size_t nbytes, std::size_t elem, void* out);

}  // namespace pdtrain::ckpt
