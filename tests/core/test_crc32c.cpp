// CRC32C against published test vectors: RFC 3720 (iSCSI), appendix B.4, and the CRC catalogue's
// check value of "123456789".
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/crc32c.hpp"

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

}  // namespace
}  // namespace pdtrain
