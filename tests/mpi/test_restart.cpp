// Restart from HDF5 checkpoints: a run of 2N steps and a run stopped after N steps then
// restarted print identical losses and the same params_crc32c (every lossless codec); a
// checkpoint written with one layout restarts on another and the loss continues within 1e-4;
// --restart auto skips a damaged newest checkpoint; lossy bitdelta deltas restart on another
// layout close to the uninterrupted run. Runs under mpiexec with 4 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <filesystem>

#include "../ckpt/ckpt_test_util.hpp"
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

// Twelve steps of batches of 6 on one holder; validation (4 batches) at the end.
const std::string kDeck =
    tiny_deck({"run.seed=3", "run.steps=12", "parallel.holders=1", "train.batch_size=6",
               "train.eval_batches=4", "optimizer.warmup_steps=3"});

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& tag) {
  const std::string d = temp_path("restart-" + tag);
  if (world_rank() == 0) fs::remove_all(d);
  MPI_Barrier(MPI_COMM_WORLD);
  return d;
}

RunOutcome run(std::vector<std::string> sets, const std::string& dir, const std::string& restart,
               std::int64_t stop_after, MPI_Comm comm = MPI_COMM_WORLD) {
  sets.push_back("run.out_dir=" + dir);
  RunOptions o;
  o.restart = restart;
  o.stop_after = stop_after;
  return run_deck(kDeck, sets, comm, o);
}

class LosslessRestart : public ::testing::TestWithParam<const char*> {};

TEST_P(LosslessRestart, IsBitExact) {
  const std::string codec = std::string("checkpoint.codec=") + GetParam();
  // Holders 2 and dp 2; checkpoints every 2 steps exercise anchors and deltas.
  const std::vector<std::string> sets = {"parallel.holders=2", codec, "checkpoint.every=2",
                                         "checkpoint.anchor_every=2"};
  const RunOutcome full = run(sets, fresh_dir(std::string("full-") + GetParam()), "", 0);
  const std::string dir = fresh_dir(std::string("cut-") + GetParam());
  const RunOutcome first = run(sets, dir, "", 7);
  const RunOutcome second = run(sets, dir, "auto", 0);
  ASSERT_EQ(full.losses.size(), 12u);
  ASSERT_EQ(first.losses.size(), 7u);
  ASSERT_EQ(second.losses.size(), 5u);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  EXPECT_EQ(second.crc, full.crc);
}

INSTANTIATE_TEST_SUITE_P(Codecs, LosslessRestart, ::testing::Values("raw", "zstd", "xor"));

TEST(Restart, OnAnotherLayoutContinuesTheLoss) {
  const RunOutcome full = run({}, fresh_dir("layout-full"), "", 0);
  const std::string dir = fresh_dir("layout-cut");
  run({"parallel.holders=2"}, dir, "", 6);  // written by 2 holders, dp 2
  // ...restarted by 1 holder and a 3-rank tensor-parallel x pipeline layout of the rest.
  MPI_Comm three = group_of(MPI_COMM_WORLD, 3);
  RunOutcome second;
  if (three != MPI_COMM_NULL) {
    second = run({"parallel.holders=1", "parallel.tp=2", "parallel.dp=1"}, dir, "auto", 0, three);
    MPI_Comm_free(&three);
    ASSERT_EQ(second.losses.size(), 6u);
    for (std::size_t i = 0; i < 6; ++i)
      EXPECT_NEAR(second.losses[i], full.losses[6 + i], 1e-4 * full.losses[6 + i]) << "step " << 7 + i;
  }
}

TEST(Restart, BitdeltaRestartIsApproximateButClose) {
  const std::vector<std::string> sets = {"checkpoint.codec=bitdelta", "checkpoint.every=3",
                                         "checkpoint.anchor_every=3"};
  const RunOutcome full = run(sets, fresh_dir("bd-full"), "", 0);
  const std::string dir = fresh_dir("bd-cut");
  run(sets, dir, "", 8);  // step 8's checkpoint is a delta against step 6's anchor...
  const RunOutcome second = run(sets, dir, "auto", 0);  // ...so the restart is approximate
  ASSERT_EQ(second.losses.size(), 4u);
  EXPECT_NE(second.crc, full.crc);
  for (std::size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(second.losses[i], full.losses[8 + i], 0.05 * full.losses[8 + i]);
}

// Issue 16: a lossy bitdelta delta (4-bit parameters, 8-bit moments) written by two holders
// restarts on a tensor-parallel x pipeline layout of one holder, and the run continues close
// to the uninterrupted one.
TEST(Restart, BitdeltaDeltaRestartsOnAnotherLayout) {
  const std::vector<std::string> sets = {"checkpoint.codec=bitdelta", "checkpoint.every=3",
                                         "checkpoint.anchor_every=3", "checkpoint.bitdelta_bits=4",
                                         "checkpoint.moment_bits=8"};
  const RunOutcome full = run(sets, fresh_dir("bd-layout-full"), "", 0);
  const std::string dir = fresh_dir("bd-layout-cut");
  std::vector<std::string> two = sets;
  two.push_back("parallel.holders=2");
  run(two, dir, "", 8);  // the final checkpoint, step 8, is a delta against step 3's anchor
  const ckpt::CheckpointMeta m = ckpt::read_meta(dir + "/checkpoints/ckpt-00000008.h5");
  ASSERT_EQ(m.codec, ckpt::Codec::bitdelta);
  EXPECT_EQ(m.anchor, "ckpt-00000003.h5");
  EXPECT_EQ(m.bits, (ckpt::BitDeltaBits{4, 8}));
  MPI_Comm three = group_of(MPI_COMM_WORLD, 3);
  if (three != MPI_COMM_NULL) {
    std::vector<std::string> other = sets;
    for (const char* kv : {"parallel.holders=1", "parallel.tp=2", "parallel.dp=1"}) other.push_back(kv);
    const RunOutcome second = run(other, dir, "auto", 0, three);
    MPI_Comm_free(&three);
    ASSERT_EQ(second.losses.size(), 4u);
    EXPECT_NE(second.crc, full.crc);  // lossy...
    for (std::size_t i = 0; i < 4; ++i)  // ...but close
      EXPECT_NEAR(second.losses[i], full.losses[8 + i], 2e-3 * full.losses[8 + i]) << "step " << 9 + i;
  }
}

// Where exactness matters, a bitdelta run's anchors give it: they are lossless zstd files, so
// a restart from one continues bit for bit, whatever widths the deltas between them use.
TEST(Restart, FromABitdeltaRunsAnchorIsBitExact) {
  const std::vector<std::string> sets = {"checkpoint.codec=bitdelta", "checkpoint.every=2",
                                         "checkpoint.anchor_every=2", "checkpoint.bitdelta_bits=2",
                                         "checkpoint.moment_bits=4"};
  const RunOutcome full = run(sets, fresh_dir("bd-anchor-full"), "", 0);
  const std::string dir = fresh_dir("bd-anchor-cut");
  const RunOutcome first = run(sets, dir, "", 6);  // an anchor at 2, a delta at 4, an anchor at 6
  EXPECT_EQ(ckpt::read_meta(dir + "/checkpoints/ckpt-00000004.h5").codec, ckpt::Codec::bitdelta);
  EXPECT_EQ(ckpt::read_meta(dir + "/checkpoints/ckpt-00000006.h5").codec, ckpt::Codec::zstd);
  const RunOutcome second = run(sets, dir, "auto", 0);
  ASSERT_EQ(second.losses.size(), 6u);
  std::vector<double> joined = first.losses;
  joined.insert(joined.end(), second.losses.begin(), second.losses.end());
  EXPECT_EQ(joined, full.losses);
  EXPECT_EQ(second.crc, full.crc);
}

// --restart auto takes the newest checkpoint that verifies: with the newest bitdelta delta
// damaged, the delta before it (not its anchor, not step 0).
TEST(Restart, AutoTakesTheNewestValidBitdeltaDelta) {
  const std::string dir = fresh_dir("bd-damaged");
  const std::vector<std::string> sets = {"checkpoint.codec=bitdelta", "checkpoint.every=2",
                                         "checkpoint.anchor_every=3", "checkpoint.moment_bits=4"};
  run(sets, dir, "", 6);  // an anchor at 2, deltas at 4 and 6
  const std::string newest = dir + "/checkpoints/ckpt-00000006.h5";
  if (world_rank() == 0) {
    EXPECT_EQ(ckpt::read_meta(dir + "/checkpoints/ckpt-00000004.h5").codec, ckpt::Codec::bitdelta);
    EXPECT_EQ(ckpt::read_meta(newest).bits.moments, 4);
    const auto [offset, size] = ckpt::test::data_location(newest, "params_codes/qkvw", {0, 0});
    ASSERT_GT(size, 0u);
    ckpt::test::flip_byte(newest, offset + size / 2);  // one block's codes damaged
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const RunOutcome resumed = run(sets, dir, "auto", 0);
  EXPECT_EQ(resumed.losses.size(), 8u);  // steps 5..12: from the step-4 delta
}

TEST(Restart, AutoSkipsADamagedNewestCheckpoint) {
  const std::string dir = fresh_dir("damaged");
  const std::vector<std::string> sets = {"checkpoint.every=3", "checkpoint.codec=raw"};
  run(sets, dir, "", 6);  // checkpoints at 3 and 6
  const std::string newest = dir + "/checkpoints/ckpt-00000006.h5";
  if (world_rank() == 0) {  // a write cut short by a crash of the file system: half the file
    ASSERT_TRUE(fs::exists(newest));
    fs::resize_file(newest, fs::file_size(newest) / 2);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // An explicit restart from the damaged file is a data error naming it.
  try {
    run(sets, dir, newest, 0);
    FAIL() << "expected a data error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::data);
    EXPECT_NE(std::string(e.what()).find("ckpt-00000006.h5"), std::string::npos) << e.what();
  }
  const RunOutcome resumed = run(sets, dir, "auto", 0);  // from step 3
  EXPECT_EQ(resumed.losses.size(), 9u);
}

}  // namespace
}  // namespace pdtrain::test
