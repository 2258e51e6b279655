// The replicated baseline (parallel.holders = 0) at tensor- and pipeline-parallel layouts: each
// rank keeps its stage shard and applies AdamW with the holders' arithmetic, the gradient norm
// is the holders' (every block once, the tied embedding summed from both stages), so it trains
// bit for bit as PD with CPU holders at the same layout: the same loss at every step and the same
// final params_crc32c. Its checkpoints (written by data-parallel replica 0, each block once)
// restart it bit-exactly, and are layout-independent: PD restarts from them, and it from PD's.
// Runs under mpiexec with 5 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

// Four layers (two per stage), two micro-batches (a pipeline with something to overlap).
const std::string kDeck = tiny_deck({"run.seed=5", "model.n_layer=4", "model.vocab_size=48",
                                     "parallel.micro_batches=2", "train.eval_every=10"});

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& tag) {
  const std::string d = temp_path("baseline-" + tag);
  if (world_rank() == 0) fs::remove_all(d);
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

// (dp, tp, pp)
struct Shape {
  int dp, tp, pp;
  std::string name() const {
    return "dp" + std::to_string(dp) + "tp" + std::to_string(tp) + "pp" + std::to_string(pp);
  }
};

std::vector<std::string> layout_sets(const Shape& s, int holders) {
  return {"parallel.holders=" + std::to_string(holders), "parallel.dp=" + std::to_string(s.dp),
          "parallel.tp=" + std::to_string(s.tp), "parallel.pp=" + std::to_string(s.pp)};
}

// The deck at `shape` with `holders` on the first holders + dp*tp*pp world ranks (the others
// wait), optionally stopped after `stop_after` steps or restarted ("auto"); every rank gets
// the outcome.
RunOutcome run(const Shape& shape, int holders, const std::string& dir,
               std::vector<std::string> extra = {}, const std::string& restart = "",
               std::int64_t stop_after = 0) {
  const int size = holders + shape.dp * shape.tp * shape.pp;
  std::vector<std::string> sets = layout_sets(shape, holders);
  sets.insert(sets.end(), extra.begin(), extra.end());
  sets.push_back("run.out_dir=" + dir);
  MPI_Comm group = group_of(MPI_COMM_WORLD, size, 1);
  RunOutcome r;
  if (group != MPI_COMM_NULL) {
    RunOptions o;
    o.restart = restart;
    o.stop_after = stop_after;
    r = run_deck(kDeck, sets, group, o);
    MPI_Comm_free(&group);
  }
  share(r, 0, MPI_COMM_WORLD);
  return r;
}

const RunOutcome& single_rank() {
  static const RunOutcome ref = run({1, 1, 1}, 0, fresh_dir("ref"));
  return ref;
}

class BaselineLayouts : public ::testing::TestWithParam<Shape> {};

// Bit for bit PD's run at the same layout, and the single rank's within the layout tolerance
// (1e-4 relative, as tests/mpi/test_layouts.cpp): the baseline trains the same model.
TEST_P(BaselineLayouts, MatchPdAtTheSameLayout) {
  ASSERT_GE(world_size(), 5);
  const Shape s = GetParam();
  const RunOutcome pd = run(s, 1, fresh_dir("pd-" + s.name()));
  const RunOutcome base = run(s, 0, fresh_dir("base-" + s.name()));
  const RunOutcome& ref = single_rank();
  ASSERT_EQ(pd.losses.size(), 20u);
  ASSERT_EQ(base.losses.size(), 20u);
  EXPECT_EQ(base.losses, pd.losses);
  EXPECT_EQ(base.crc, pd.crc);
  for (std::size_t i = 0; i < 20; ++i)
    EXPECT_NEAR(base.losses[i], ref.losses[i], 1e-4 * std::abs(ref.losses[i])) << "step " << i + 1;
  EXPECT_LT(base.losses.back(), base.losses.front() - 0.5);  // it learns
}

INSTANTIATE_TEST_SUITE_P(Shapes, BaselineLayouts,
                         ::testing::Values(Shape{1, 2, 1}, Shape{1, 1, 2}, Shape{1, 2, 2},
                                           Shape{2, 2, 1}, Shape{2, 1, 2}),
                         [](const auto& info) { return info.param.name(); });

// Checkpoints every 3 steps (a delta codec: anchors and deltas), stopped after 7, restarted.
const std::vector<std::string> kCheckpoints = {"checkpoint.every=3", "checkpoint.codec=xor",
                                               "checkpoint.anchor_every=2"};

std::vector<double> joined(const RunOutcome& a, const RunOutcome& b) {
  std::vector<double> all = a.losses;
  all.insert(all.end(), b.losses.begin(), b.losses.end());
  return all;
}

TEST(BaselineRestart, AtTensorAndPipelineParallelismIsBitExact) {
  const Shape s{1, 2, 2};
  const RunOutcome full = run(s, 0, fresh_dir("full"), kCheckpoints);
  const std::string dir = fresh_dir("cut");
  const RunOutcome first = run(s, 0, dir, kCheckpoints, "", 7);
  const RunOutcome second = run(s, 0, dir, kCheckpoints, "auto");
  ASSERT_EQ(first.losses.size(), 7u);
  ASSERT_EQ(second.losses.size(), 13u);
  EXPECT_EQ(joined(first, second), full.losses);
  EXPECT_EQ(second.crc, full.crc);
}

// The baseline's checkpoint holds the model, not its layout: PD at the same layout continues it
// bit for bit (as the baseline itself would), and the baseline continues PD's.
TEST(BaselineRestart, CheckpointsAreLayoutIndependent) {
  const Shape s{1, 2, 2};
  const RunOutcome full = run(s, 0, fresh_dir("li-full"), kCheckpoints);
  const std::string from_base = fresh_dir("li-base");
  const RunOutcome base_first = run(s, 0, from_base, kCheckpoints, "", 6);
  // On another layout (two data-parallel pipeline replicas) the loss continues within the
  // layout tolerance.
  const RunOutcome other = run({2, 1, 2}, 0, fresh_dir("li-other"), {},
                               from_base + "/checkpoints/ckpt-00000006.h5");
  ASSERT_EQ(other.losses.size(), 14u);
  for (std::size_t i = 0; i < 14; ++i)
    EXPECT_NEAR(other.losses[i], full.losses[6 + i], 1e-4 * full.losses[6 + i]) << "step " << 7 + i;
  const RunOutcome pd_second = run(s, 1, from_base, kCheckpoints, "auto");
  ASSERT_EQ(pd_second.losses.size(), 14u);
  EXPECT_EQ(joined(base_first, pd_second), full.losses);
  EXPECT_EQ(pd_second.crc, full.crc);

  const std::string from_pd = fresh_dir("li-pd");
  const RunOutcome pd_first = run(s, 1, from_pd, kCheckpoints, "", 6);
  const RunOutcome base_second = run(s, 0, from_pd, kCheckpoints, "auto");
  ASSERT_EQ(base_second.losses.size(), 14u);
  EXPECT_EQ(joined(pd_first, base_second), full.losses);
  EXPECT_EQ(base_second.crc, full.crc);
}

}  // namespace
}  // namespace pdtrain::test
