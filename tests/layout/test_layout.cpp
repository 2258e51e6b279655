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
