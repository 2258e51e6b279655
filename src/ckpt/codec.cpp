#include "pdtrain/ckpt/codec.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain::ckpt {

const char* codec_name(Codec c) {
  switch (c) {
    case Codec::raw: return "raw";
    case Codec::zstd: return "zstd";
    case Codec::xor_delta: return "xor";
    case Codec::bitdelta: return "bitdelta";
  }
  return "?";
}

std::optional<Codec> codec_from_string(std::string_view s) {
  for (Codec c : {Codec::raw, Codec::zstd, Codec::xor_delta, Codec::bitdelta})
    if (s == codec_name(c)) return c;
  return std::nullopt;
}

Codec parse_codec(std::string_view s) {
  if (auto c = codec_from_string(s)) return *c;
  throw Error(ExitCode::deck, "unknown checkpoint codec '" + std::string(s) +
                                  "' (expected raw, zstd, xor or bitdelta)");
}

void xor_bits(const std::uint32_t* value, const std::uint32_t* anchor, std::uint32_t* out,
              std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = value[i] ^ anchor[i];
}

float bitdelta_encode(const float* param, const float* anchor, std::size_t n,
                      std::uint8_t* signs) {
  std::memset(signs, 0, sign_bytes(n));
  double sum_abs = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    // The difference of two floats is exact in double, so the scale does not depend on how
    // the compiler rounds intermediate fp32 arithmetic.
    const double d = static_cast<double>(param[i]) - static_cast<double>(anchor[i]);
    if (d < 0) signs[i / 8] |= static_cast<std::uint8_t>(1u << (i % 8));
    sum_abs += std::fabs(d);
  }
  return n == 0 ? 0.0f : static_cast<float>(sum_abs / static_cast<double>(n));
}

void bitdelta_decode(const float* anchor, const std::uint8_t* signs, float scale, std::size_t n,
                     float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const bool negative = (signs[i / 8] >> (i % 8)) & 1u;
    out[i] = anchor[i] + (negative ? -scale : scale);
  }
}

void shuffle_bytes(const void* in, std::size_t nbytes, std::size_t elem, void* out) {
  const auto* src = static_cast<const unsigned char*>(in);
  auto* dst = static_cast<unsigned char*>(out);
  const std::size_t count = elem == 0 ? 0 : nbytes / elem;
  if (elem <= 1 || count <= 1) {  // HDF5 leaves such buffers alone
    std::memcpy(dst, src, nbytes);
    return;
  }
  for (std::size_t j = 0; j < elem; ++j)
    for (std::size_t i = 0; i < count; ++i) dst[j * count + i] = src[i * elem + j];
  const std::size_t done = count * elem;
  std::memcpy(dst + done, src + done, nbytes - done);
}

}  // namespace pdtrain::ckpt
