// Layout resolution (pure functions: no MPI needed).
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

TEST(LayoutShape, ComputeRanksFollowTheHoldersTensorRanksFastest) {
  const LayoutShape s{2, 2, 2, 3};  // holders, dp, tp, pp
  EXPECT_EQ(s.compute_rank(0, 0, 0), 2);
  EXPECT_EQ(s.compute_rank(0, 0, 1), 3);
  EXPECT_EQ(s.compute_rank(0, 1, 0), 4);
  EXPECT_EQ(s.compute_rank(1, 2, 1), 2 + (1 * 3 + 2) * 2 + 1);
  EXPECT_EQ(s.fetcher_rank(2, 1), s.compute_rank(0, 2, 1));  // replica 0 fetches
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

}  // namespace
}  // namespace pdtrain
