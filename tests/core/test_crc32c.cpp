// CRC32C against published test vectors: RFC 3720 (iSCSI), appendix B.4, and the CRC catalogue's
// check value of "123456789".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/crc32c.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#endif

namespace pdtrain {
namespace {

std::vector<std::uint8_t> bytes_from(int first, int step) {
  std::vector<std::uint8_t> v(32);
  for (int i = 0; i < 32; ++i) v[i] = static_cast<std::uint8_t>(first + step * i);
  return v;
}

TEST(Crc32c, Rfc3720Vectors) {
  const std::vector<std::uint8_t> zeros(32, 0x00), ones(32, 0xFF);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  const std::vector<std::uint8_t> ascending = bytes_from(0, 1), descending = bytes_from(31, -1);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(descending.data(), descending.size()), 0x113FDB5Cu);
}

TEST(Crc32c, CheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(crc32c(s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(crc32c(s.data(), 0), 0u);  // the empty message
}

TEST(Crc32c, ExtendContinuesARunningCrcAtEverySplit) {
  const std::string s = "123456789";
  for (std::size_t k = 0; k <= s.size(); ++k)
    EXPECT_EQ(crc32c_extend(crc32c(s.data(), k), s.data() + k, s.size() - k), 0xE3069283u)
        << "split at " << k;
}

// Slices checksummed apart (by different threads) combine into the whole's CRC, at every split
// and for lengths past the 2^k boundaries of the shift table.
TEST(Crc32c, CombineEqualsTheCrcOfTheConcatenation) {
  const std::string s = "123456789";
  for (std::size_t k = 0; k <= s.size(); ++k)
    EXPECT_EQ(crc32c_combine(crc32c(s.data(), k), crc32c(s.data() + k, s.size() - k), s.size() - k),
              0xE3069283u)
        << "split at " << k;
  std::vector<std::uint8_t> big(300000);
  for (std::size_t i = 0; i < big.size(); ++i)
    big[i] = static_cast<std::uint8_t>(i * 131 + (i >> 9));
  const std::uint32_t whole = crc32c(big.data(), big.size());
  for (std::size_t k : {std::size_t{1}, std::size_t{4096}, std::size_t{65537}, std::size_t{299999}})
    EXPECT_EQ(crc32c_combine(crc32c(big.data(), k), crc32c(big.data() + k, big.size() - k),
                             big.size() - k),
              whole)
        << "split at " << k;
}

// The copy's CRC is the source's, across chunk boundaries and continuing a running CRC; the
// copy is exact and writes nothing past its end.
TEST(Crc32c, CopyCopiesAndTakesTheCrcOfWhatItCopied) {
  std::vector<std::uint8_t> src(3 * 8192 + 77);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::uint8_t>(i * 37 + (i >> 11));
  for (std::size_t n : {std::size_t{0}, std::size_t{9}, std::size_t{8192}, std::size_t{8193},
                        src.size()}) {
    std::vector<std::uint8_t> dst(src.size() + 1, 0xA5);
    EXPECT_EQ(crc32c_copy(0u, dst.data(), src.data(), n), crc32c(src.data(), n)) << n << " bytes";
    EXPECT_TRUE(std::equal(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(n), dst.begin()));
    EXPECT_EQ(dst[n], 0xA5) << "wrote past " << n << " bytes";
    const std::uint32_t head = crc32c(src.data(), 5);
    EXPECT_EQ(crc32c_copy(head, dst.data(), src.data() + 5, n - std::min<std::size_t>(n, 5)),
              crc32c(src.data(), std::max<std::size_t>(n, 5)));
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// XINUSE (XGETBV with ECX = 1): the register state components that are not in their initial
// state. Bit 2: the upper halves of YMM0-15; bit 6: the upper halves of ZMM0-15.
std::uint64_t state_in_use() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(1));
  return (std::uint64_t{hi} << 32) | lo;
}

bool can_read_state_in_use() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
  return __get_cpuid_count(0xD, 1, &a, &b, &c, &d) && (a & (1u << 2)) != 0;
}

// The state in use just after vzeroupper: a CPU (or hypervisor) that tracks it precisely says
// the upper halves are clean there.
__attribute__((target("avx"))) std::uint64_t state_after_zeroing() {
  __builtin_ia32_vzeroupper();
  return state_in_use();
}
#endif

// ISA-L's vector CRC returns with the upper halves of the vector registers dirty; until they
// are cleared every legacy-SSE instruction pays for merging with them, and this build's scalar
// code is SSE (GPT-2 124M's initial values took 4-5 x as long on a holder that took CRCs between
// blocks). Both CRC entry points leave the upper halves clean.
TEST(Crc32c, LeavesTheUpperHalvesOfTheVectorRegistersClean) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (!can_read_state_in_use()) GTEST_SKIP() << "this CPU cannot say which register state is in use";
  constexpr std::uint64_t kUpperHalves = (1u << 2) | (1u << 6);
  if ((state_after_zeroing() & kUpperHalves) != 0)
    GTEST_SKIP() << "this CPU reports the upper halves in use even after vzeroupper";
  std::vector<std::uint8_t> src(1 << 16, 7), dst(src.size());
  volatile std::uint32_t sink = crc32c(src.data(), src.size());
  const std::uint64_t after_crc = state_in_use();
  sink = crc32c_copy(0u, dst.data(), src.data(), src.size());
  const std::uint64_t after_copy = state_in_use();
  (void)sink;
  EXPECT_EQ(after_crc & kUpperHalves, 0u) << "crc32c";
  EXPECT_EQ(after_copy & kUpperHalves, 0u) << "crc32c_copy";
#else
  GTEST_SKIP() << "x86-64 only";
#endif
}

}  // namespace
}  // namespace pdtrain
