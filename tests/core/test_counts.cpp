// Counts and displacements, the even split, and the cutting of messages into int-sized pieces,
// with sizes far above INT_MAX (no memory is needed to check the arithmetic).
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <vector>

#include "pdtrain/core/counts.hpp"

namespace pdtrain {
namespace {

constexpr std::int64_t kGi = std::int64_t{1} << 30;

TEST(Displacements, ExclusivePrefixSum) {
  EXPECT_EQ(displacements(std::vector<int>{3, 0, 5, 2}), (std::vector<int>{0, 3, 3, 8}));
  EXPECT_TRUE(displacements(std::vector<int>{}).empty());
  // 64-bit counts past INT_MAX.
  const std::vector<std::int64_t> big = {3 * kGi, 5 * kGi, 1};
  EXPECT_EQ(displacements(big), (std::vector<std::int64_t>{0, 3 * kGi, 8 * kGi}));
}

TEST(SplitEvenly, PartsDifferByAtMostOneAndCoverEverything) {
  EXPECT_EQ(split_evenly(10, 3), (std::vector<std::int64_t>{3, 3, 4}));
  EXPECT_EQ(split_evenly(2, 4), (std::vector<std::int64_t>{0, 1, 0, 1}));
  EXPECT_EQ(split_evenly(0, 2), (std::vector<std::int64_t>{0, 0}));
  const std::int64_t n = 9 * kGi + 5;  // 36 GiB of floats
  const std::vector<std::int64_t> parts = split_evenly(n, 4);
  std::int64_t total = 0;
  for (std::int64_t p : parts) {
    EXPECT_GE(p, n / 4);
    EXPECT_LE(p, n / 4 + 1);
    total += p;
  }
  EXPECT_EQ(total, n);
}

void expect_pieces_cover(std::int64_t n, std::int64_t max_piece) {
  const std::vector<MessagePiece> pieces = message_pieces(n, max_piece);
  std::int64_t next = 0;
  for (const MessagePiece& p : pieces) {
    EXPECT_EQ(p.offset, next);
    EXPECT_GE(p.count, 1);
    EXPECT_LE(p.count, max_piece);
    next += p.count;
  }
  EXPECT_EQ(next, n) << "n " << n << " max_piece " << max_piece;
  EXPECT_EQ(static_cast<std::int64_t>(pieces.size()), (n + max_piece - 1) / max_piece);
}

TEST(MessagePieces, EveryPieceFitsAnIntAndTheyTileTheMessage) {
  EXPECT_TRUE(message_pieces(0, 10).empty());
  expect_pieces_cover(1, 1);
  expect_pieces_cover(10, 3);
  expect_pieces_cover(10, 10);
  expect_pieces_cover(11, 10);
  // Above 2^31 floats: counts that an int could not hold.
  expect_pieces_cover(5 * (std::int64_t{1} << 31) + 7, INT_MAX);
  expect_pieces_cover(std::int64_t{1} << 40, kGi);
  expect_pieces_cover(std::int64_t{INT_MAX} + 1, INT_MAX);
  const std::vector<MessagePiece> two = message_pieces(std::int64_t{INT_MAX} + 1, INT_MAX);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[1].offset, INT_MAX);
  EXPECT_EQ(two[1].count, 1);
}

}  // namespace
}  // namespace pdtrain
