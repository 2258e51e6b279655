#include "pdtrain/ckpt/codec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

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

namespace {

// Codes of at most 8 bits span at most two bytes.
void put_code(std::uint8_t* codes, std::size_t i, int bits, unsigned c) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  const unsigned w = c << (bit % 8);
  codes[bit / 8] |= static_cast<std::uint8_t>(w & 0xffu);
  if (bit % 8 + static_cast<std::size_t>(bits) > 8)
    codes[bit / 8 + 1] |= static_cast<std::uint8_t>(w >> 8);
}

unsigned get_code(const std::uint8_t* codes, std::size_t i, int bits) {
  const std::size_t bit = i * static_cast<std::size_t>(bits);
  unsigned w = codes[bit / 8];
  if (bit % 8 + static_cast<std::size_t>(bits) > 8)
    w |= static_cast<unsigned>(codes[bit / 8 + 1]) << 8;
  return (w >> (bit % 8)) & ((1u << bits) - 1u);
}

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float float_of(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A linear level: lo + c * step, exact in double (c has at most 8 bits), rounded once to fp32.
float level(float lo, float step, unsigned c) {
  return static_cast<float>(static_cast<double>(lo) +
                            static_cast<double>(c) * static_cast<double>(step));
}

void check_value(Quantizer q, float x) {
  if (!std::isfinite(x) || (q == Quantizer::log && x < 0))
    throw Error(ExitCode::runtime,
                "checkpoint: bitdelta cannot encode the value " + std::to_string(x) +
                    (q == Quantizer::log ? " (a second moment must be >= 0)" : ""));
}

// One group of delta or linear values y (x - ref, or x, exact in double): its scale pair
// (lo, step) as fp32 bits and its codes.
void quantize_linear_group(int bits, const double* y, std::size_t n, std::size_t first,
                           std::uint8_t* codes, std::uint32_t* scales) {
  float lo = 0.0f, step = 0.0f;
  if (bits == 1) {  // BitDelta: the scale that minimizes the squared error for the signs
    double sum_abs = 0.0;
    for (std::size_t i = 0; i < n; ++i) sum_abs += std::fabs(y[i]);
    const float s = static_cast<float>(sum_abs / static_cast<double>(n));
    lo = -s;
    step = 2.0f * s;  // exact: levels -s and +s
    for (std::size_t i = 0; i < n; ++i) put_code(codes, first + i, 1, y[i] < 0 ? 0u : 1u);
  } else {
    const double top = static_cast<double>((1u << bits) - 1u);
    double mn = y[0], mx = y[0];
    for (std::size_t i = 1; i < n; ++i) mn = std::min(mn, y[i]), mx = std::max(mx, y[i]);
    lo = static_cast<float>(mn);
    step = static_cast<float>((mx - static_cast<double>(lo)) / top);
    for (std::size_t i = 0; i < n; ++i) {
      const double c = step > 0 ? std::nearbyint((y[i] - lo) / static_cast<double>(step)) : 0.0;
      put_code(codes, first + i, bits, static_cast<unsigned>(std::clamp(c, 0.0, top)));
    }
  }
  scales[0] = bits_of(lo);
  scales[1] = bits_of(step);
}

// One group of second moments: codes of their bit patterns between the least and largest
// positive pattern (lo, hi); code 0 is exactly zero.
void quantize_log_group(int bits, const float* x, std::size_t n, std::size_t first,
                        std::uint8_t* codes, std::uint32_t* scales) {
  std::uint32_t lo = 0, hi = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t p = x[i] > 0 ? bits_of(x[i]) : 0;
    if (p == 0) continue;
    lo = lo == 0 ? p : std::min(lo, p);
    hi = std::max(hi, p);
  }
  const std::uint64_t intervals = (1u << bits) - 2u, span = hi - lo;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t p = x[i] > 0 ? bits_of(x[i]) : 0;
    if (p == 0) continue;  // code 0
    const std::uint64_t c = span == 0 ? 0 : (2 * (p - lo) * intervals + span) / (2 * span);
    put_code(codes, first + i, bits, static_cast<unsigned>(1 + c));
  }
  scales[0] = lo;
  scales[1] = hi;
}

float log_level(std::uint32_t lo, std::uint32_t hi, int bits, unsigned c) {
  if (c == 0) return 0.0f;
  const std::uint64_t intervals = (1u << bits) - 2u, span = hi - lo;
  return float_of(lo + static_cast<std::uint32_t>((2 * (c - 1u) * span + intervals) /
                                                  (2 * intervals)));
}

}  // namespace

std::optional<StateQuant> state_quant(Codec c, const BitDeltaBits& b, int k) {
  if (c != Codec::bitdelta) return std::nullopt;
  if (k == 0) return StateQuant{Quantizer::delta, b.params};
  if (b.moments == 0) return std::nullopt;
  return StateQuant{k == 1 ? Quantizer::linear : Quantizer::log, b.moments};
}

float quantize(Quantizer q, int bits, const float* x, const float* ref, std::size_t n,
               std::uint8_t* codes, std::uint32_t* scales, float* decoded) {
  std::memset(codes, 0, code_bytes(n, bits));
  std::vector<double> y(std::min(n, kQuantGroup));
  for (std::size_t g = 0; g * kQuantGroup < n; ++g) {
    const std::size_t first = g * kQuantGroup, len = std::min(kQuantGroup, n - first);
    for (std::size_t i = first; i < first + len; ++i) check_value(q, x[i]);
    if (q == Quantizer::log) {
      quantize_log_group(bits, x + first, len, first, codes, scales + 2 * g);
      continue;
    }
    // The difference of two floats is exact in double, so the scales do not depend on how
    // the compiler rounds intermediate fp32 arithmetic.
    for (std::size_t i = 0; i < len; ++i)
      y[i] = static_cast<double>(x[first + i]) -
             (q == Quantizer::delta ? static_cast<double>(ref[first + i]) : 0.0);
    quantize_linear_group(bits, y.data(), len, first, codes, scales + 2 * g);
  }
  dequantize(q, bits, codes, scales, ref, n, decoded);
  float worst = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    const double err = std::fabs(static_cast<double>(decoded[i]) - static_cast<double>(x[i]));
    const double e = q == Quantizer::log ? (x[i] > 0 ? err / x[i] : 0.0) : err;
    float f = static_cast<float>(e);
    if (static_cast<double>(f) < e) f = std::nextafter(f, INFINITY);  // a bound: round up
    worst = std::max(worst, f);
  }
  return worst;
}

void dequantize(Quantizer q, int bits, const std::uint8_t* codes, const std::uint32_t* scales,
                const float* ref, std::size_t n, float* out) {
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint32_t* s = scales + 2 * (i / kQuantGroup);
    const unsigned c = get_code(codes, i, bits);
    if (q == Quantizer::log) {
      out[i] = log_level(s[0], s[1], bits, c);
      continue;
    }
    const float v = level(float_of(s[0]), float_of(s[1]), c);
    out[i] = q == Quantizer::delta ? ref[i] + v : v;
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
