#include "pdtrain/core/crc32c.hpp"

#include <isa-l/crc.h>

#include <algorithm>
#include <climits>
#include <cstring>

namespace pdtrain {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx"))) void zero_upper_halves() { __builtin_ia32_vzeroupper(); }
#endif

// ISA-L's AVX-512 CRC (crc32_iscsi_by16_10 on CPUs with VPCLMULQDQ) returns with the upper
// halves of the vector registers dirty: it ends without vzeroupper. Until something clears
// them, every legacy-SSE instruction after it pays for merging with those halves (Intel since
// Skylake), and this build's scalar float code is SSE (no -march): GPT-2 124M's initial values
// took a holder 41.7 s of CPU with each block's CRC between them, 9.4 s with the halves cleared
// (Xeon with AMX; perf/RESULTS.md, "A fresh start's initial values").
void after_isal() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx = __builtin_cpu_supports("avx");
  if (avx) zero_upper_halves();
#endif
}

}  // namespace

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) {
  // ISA-L's crc32_iscsi keeps the register un-inverted between calls; the standard CRC32C
  // inverts on entry and exit.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  std::uint32_t reg = ~crc;
  while (n > 0) {
    const int chunk = n > static_cast<std::size_t>(INT_MAX / 2) ? INT_MAX / 2 : static_cast<int>(n);
    reg = crc32_iscsi(p, chunk, reg);
    p += chunk;
    n -= static_cast<std::size_t>(chunk);
  }
  after_isal();
  return ~reg;
}

std::uint32_t crc32c(const void* data, std::size_t n) { return crc32c_extend(0u, data, n); }

std::uint32_t crc32c_copy(std::uint32_t crc, void* dst, const void* src, std::size_t n) {
  // 8 KiB: the chunk and its source line stay in a 32 KiB L1 (measured: 8 KiB 1.04 x memcpy,
  // 32 KiB 1.13 x, 128 KiB and up 1.2 x).
  constexpr std::size_t kChunk = 8 << 10;
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  std::uint32_t reg = ~crc;
  for (std::size_t done = 0; done < n;) {
    const std::size_t c = std::min(kChunk, n - done);
    std::memcpy(d + done, s + done, c);
    reg = crc32_iscsi(d + done, static_cast<int>(c), reg);
    done += c;
  }
  after_isal();
  return ~reg;
}

namespace {

// Arithmetic on polynomials over GF(2) modulo the Castagnoli polynomial, bit-reflected as the
// CRC is (bit 31 is x^0), after zlib's crc32_combine.
constexpr std::uint32_t kCastagnoli = 0x82F63B78u;

// a * b mod P.
constexpr std::uint32_t multiply_mod_p(std::uint32_t a, std::uint32_t b) {
  std::uint32_t m = 1u << 31, p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kCastagnoli : b >> 1;
  }
  return p;
}

// x^(2^k) mod P for k = 0..31.
struct PowersOfX {
  std::uint32_t x2k[32]{};
  constexpr PowersOfX() {
    std::uint32_t p = 1u << 30;  // x^1
    for (auto& x : x2k) {
      x = p;
      p = multiply_mod_p(p, p);
    }
  }
};
constexpr PowersOfX kPowers;

// x^(8 * bytes) mod P: appending `bytes` zero bytes multiplies a CRC register by it.
std::uint32_t shift_for_bytes(std::size_t bytes) {
  std::uint32_t p = 1u << 31;  // x^0
  for (unsigned k = 3; bytes != 0; bytes >>= 1, ++k)
    if (bytes & 1) p = multiply_mod_p(kPowers.x2k[k & 31], p);
  return p;
}

}  // namespace

std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::size_t bytes_b) {
  return multiply_mod_p(shift_for_bytes(bytes_b), crc_a) ^ crc_b;
}

}  // namespace pdtrain
