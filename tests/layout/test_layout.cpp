// Layout resolution and block placement (pure functions: no MPI needed).
#include <gtest/gtest.h>

#include "pdtrain/core/error.hpp"
#include "pdtrain/layout/layout.hpp"

namespace pdtrain {
namespace {

Deck deck_with(const std::vector<std::string>& sets) {
  return parse_deck("[run]\nsteps = 2\n[train]\nbatch_size = 12\n", "t.toml", sets);
}

TEST(ResolveLayout, AutoDpTakesTheRest) {
  const LayoutShape s = resolve_layout(deck_with({"parallel.holders=2"}), 5);
  EXPECT_EQ(s.dp, 3);
  EXPECT_EQ(s.world(), 5);
}

TEST(ResolveLayout, ErrorsNameTheKeyAndExitWithLayoutStatus) {
  try {
    resolve_layout(deck_with({"parallel.holders=1", "parallel.dp=2"}), 4);
    FAIL() << "expected a layout error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::layout);
    EXPECT_NE(std::string(e.what()).find("--set parallel.dp"), std::string::npos) << e.what();
  }
  EXPECT_THROW(resolve_layout(deck_with({"parallel.holders=3"}), 3), Error);
  EXPECT_THROW(resolve_layout(deck_with({"parallel.holders=0", "train.batch_size=5"}), 2), Error);
}

TEST(PlaceBlocks, ContiguousAndBalancedByBytes) {
  const std::vector<std::int64_t> bytes = {100, 100, 100, 100, 400, 100, 100, 100};
  const std::vector<int> owner = place_blocks(bytes, 2);
  for (std::size_t i = 1; i < owner.size(); ++i) EXPECT_GE(owner[i], owner[i - 1]);
  std::int64_t load[2] = {0, 0};
  for (std::size_t i = 0; i < owner.size(); ++i) load[owner[i]] += bytes[i];
  EXPECT_LE(std::abs(load[0] - load[1]), 400);
  EXPECT_EQ(place_blocks(bytes, 1), std::vector<int>(bytes.size(), 0));
  // More holders than blocks: every block placed on a valid holder.
  for (int o : place_blocks({4, 4}, 5)) EXPECT_LT(o, 5);
}

}  // namespace
}  // namespace pdtrain

namespace pdtrain {
namespace {

TEST(PlaceBlocksNear, OneNodeIsTheContiguousBalancedPlacement) {
  const std::vector<std::int64_t> served = {40, 10, 10, 20, 30, 10, 40};
  EXPECT_EQ(place_blocks_near(served, std::vector<int>(7, 0), {0, 0, 0}),
            place_blocks(served, 3));
}

TEST(PlaceBlocksNear, BlocksStayOnTheirNodeWhenBalanceAllows) {
  // Blocks 0-3 are fetched from node 0, 4-7 from node 1; one holder per node.
  const std::vector<std::int64_t> served(8, 100);
  const std::vector<int> owner =
      place_blocks_near(served, {0, 0, 0, 0, 1, 1, 1, 1}, std::vector<int>{0, 1});
  EXPECT_EQ(owner, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(PlaceBlocksNear, BalanceWinsOverLocality) {
  // Every block is fetched on node 0 but holders sit on nodes 0 and 1: each still serves half.
  const std::vector<std::int64_t> served(10, 100);
  const std::vector<int> owner = place_blocks_near(served, std::vector<int>(10, 0), {0, 1});
  std::int64_t load[2] = {0, 0};
  for (std::size_t b = 0; b < owner.size(); ++b) load[owner[b]] += served[b];
  EXPECT_EQ(load[0], 500);
  EXPECT_EQ(load[1], 500);
  EXPECT_EQ(owner[0], 0);  // node 0's holder is filled first
}

}  // namespace
}  // namespace pdtrain
