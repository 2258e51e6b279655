#include "pdtrain/ckpt/canonical_crc.hpp"

#include <algorithm>
#include <array>

#include "pdtrain/core/crc32c.hpp"

namespace pdtrain::ckpt {
namespace {

// CRC32C's polynomial, bit-reflected (the CRC is computed LSB first).
constexpr std::uint32_t kPoly = 0x82F63B78u;

// a * b modulo the polynomial, in the reflected representation (x^0 is the top bit).
std::uint32_t multmodp(std::uint32_t a, std::uint32_t b) {
  std::uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

// x^(2^k) modulo the polynomial, k = 0..31.
const std::array<std::uint32_t, 32>& x2n_table() {
  static const std::array<std::uint32_t, 32> table = [] {
    std::array<std::uint32_t, 32> t{};
    std::uint32_t p = 1u << 30;  // x^1
    t[0] = p;
    for (int n = 1; n < 32; ++n) t[n] = p = multmodp(p, p);
    return t;
  }();
  return table;
}

// x^(n * 2^k) modulo the polynomial.
std::uint32_t x2nmodp(std::uint64_t n, unsigned k) {
  std::uint32_t p = 1u << 31;  // x^0
  while (n) {
    if (n & 1) p = multmodp(x2n_table()[k & 31], p);
    n >>= 1;
    ++k;
  }
  return p;
}

}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  // Shifting A's CRC over len_b zero bytes (x^(8 len_b)) and adding B's: the pre- and
  // post-inversion of the standard CRC cancel out as in zlib's crc32_combine.
  return multmodp(x2nmodp(len_b, 3), crc_a) ^ crc_b;
}

void append_crc_pieces(const ParamCatalog& catalog, const BlockInfo& b, const float* packed,
                       std::vector<CrcPiece>& out) {
  const TensorInfo& t = catalog.tensor(b.tensor);
  if (b.cols == t.cols) {  // full rows: the whole block is contiguous in canonical order
    out.push_back({catalog.canonical_index(b, 0, 0), b.numel(),
                   crc32c(packed, static_cast<std::size_t>(b.numel()) * sizeof(float))});
    return;
  }
  for (std::int64_t r = 0; r < b.rows; ++r)
    out.push_back({catalog.canonical_index(b, r, 0), b.cols,
                   crc32c(packed + r * b.cols, static_cast<std::size_t>(b.cols) * sizeof(float))});
}

std::optional<std::uint32_t> combine_crc_pieces(std::vector<CrcPiece> pieces,
                                                std::int64_t total_numel) {
  std::sort(pieces.begin(), pieces.end(),
            [](const CrcPiece& a, const CrcPiece& b) { return a.offset < b.offset; });
  std::uint32_t crc = 0;  // CRC32C of the empty string
  std::int64_t end = 0;
  for (const CrcPiece& p : pieces) {
    if (p.offset != end) return std::nullopt;  // a gap or an overlap
    crc = crc32c_combine(crc, p.crc, static_cast<std::uint64_t>(p.count) * sizeof(float));
    end += p.count;
  }
  if (end != total_numel) return std::nullopt;
  return crc;
}

}  // namespace pdtrain::ckpt
