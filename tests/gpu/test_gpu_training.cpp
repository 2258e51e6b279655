// Training on GPUs, against the CPU and against itself (5 ranks, all sharing GPU 0 of this
// node, ctest label gpu; skipped without a GPU):
//  - the GPU single rank follows the CPU single rank within the kernels' tolerance (fp32, bf16);
//  - PD with CPU holders and a GPU compute rank is bit-identical to the GPU baseline (the
//    holders' AdamW and the GPU's are the same arithmetic), for every prefetch depth and cache
//    bound;
//  - tp 2 x pp 2 on one shared GPU stays within tolerance of the GPU single rank, and the GPU
//    baseline at that layout (each rank its stage shard on the GPU) is bit-identical to it;
//  - a rerun gives the same params_crc32c.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <string>
#include <vector>

#include "../mpi/run_helpers.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::test {
namespace {

// A wider model (4 heads, d_model 64), copying at lag 2; small batches of short sequences, so
// that the emulated GPU (tests/emulation, under sanitizers) trains it in seconds.
const std::string kDeck =
    tiny_deck({"run.seed=11", "model.n_head=4", "model.d_model=64", "model.vocab_size=96",
               "model.seq_len=16", "data.copy_lag=2", "train.batch_size=4"});

// Every test shares GPU 0 among several ranks, which only its Default compute mode allows.
class GpuTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    int ok = kernels::cuda_gpu_shareable(0) ? 1 : 0, all = 0;
    MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all == 0) GTEST_SKIP() << "GPU 0 is not in the Default compute mode: ranks cannot share it";
  }
};

// `sets` on the first `ranks` ranks of the world (the others wait); shared with every rank.
RunOutcome run_on(int ranks, const std::vector<std::string>& sets, const std::string& tag) {
  return first_group_run(kDeck, ranks, sets, temp_path("gpu-" + tag));
}

void expect_close(const RunOutcome& got, const RunOutcome& ref, double rel, const char* what) {
  ASSERT_EQ(got.losses.size(), 20u) << what;
  ASSERT_EQ(ref.losses.size(), 20u) << what;
  for (std::size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], rel * std::abs(ref.losses[s]))
        << what << ": step " << s + 1;
}

void expect_identical(const RunOutcome& got, const RunOutcome& ref, const char* what) {
  EXPECT_EQ(got.losses, ref.losses) << what;
  EXPECT_EQ(got.crc, ref.crc) << what;
}

const std::vector<std::string> kCuda = {"compute.device=cuda"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// fp32: the GPU sums in other orders than the CPU (cuBLASLt, warp trees); after 20 steps of
// training the losses agree to ~1e-5 relative. bf16: a different order can flip a weight's
// bf16 rounding (2^-8), as between CPU layouts (tests/mpi/test_layouts.cpp).
TEST_F(GpuTraining, SingleRankFollowsTheCpuSingleRank) {
  for (const auto& [precision, rel] : {std::pair{"fp32", 1e-4}, {"bf16", 2e-3}}) {
    const std::string p = std::string("train.precision=") + precision;
    const RunOutcome cpu = run_on(1, {p}, std::string("cpu-") + precision);
    const RunOutcome gpu = run_on(1, with({p}, kCuda), std::string("gpu-") + precision);
    expect_close(gpu, cpu, rel, precision);
    EXPECT_LT(gpu.losses.back(), gpu.losses.front()) << precision << ": the model learns";
  }
}

TEST_F(GpuTraining, PdWithCpuHoldersIsBitIdenticalToTheGpuBaseline) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string p = std::string("train.precision=") + precision;
    const RunOutcome baseline = run_on(1, with({p}, kCuda), std::string("base-") + precision);
    const RunOutcome pd =
        run_on(2, with({p, "parallel.holders=1"}, kCuda), std::string("pd-") + precision);
    expect_identical(pd, baseline, precision);
    // Prefetch and the cache bound change when blocks move, never a number.
    for (const std::vector<std::string>& s :
         {std::vector<std::string>{"pd.prefetch_depth=0"},
          std::vector<std::string>{"pd.prefetch_depth=2", "pd.cache_mb=0.3"},
          std::vector<std::string>{"pd.cache_mb=0.3", "train.recompute=attention"}}) {
      const RunOutcome other = run_on(2, with(with({p, "parallel.holders=1"}, kCuda), s),
                                      std::string("pd-var-") + precision);
      expect_identical(other, baseline, (std::string(precision) + " " + s[0]).c_str());
    }
  }
}

TEST_F(GpuTraining, TensorAndPipelineParallelOnOneSharedGpu) {
  const RunOutcome single = run_on(1, kCuda, "tp-ref");
  const RunOutcome tp_pp =
      run_on(5, with({"parallel.holders=1", "parallel.tp=2", "parallel.pp=2",
                      "parallel.micro_batches=2"}, kCuda),
             "tp2pp2");
  expect_close(tp_pp, single, 1e-4, "tp 2 x pp 2");
  const RunOutcome again =
      run_on(5, with({"parallel.holders=1", "parallel.tp=2", "parallel.pp=2",
                      "parallel.micro_batches=2"}, kCuda),
             "tp2pp2-again");
  expect_identical(again, tp_pp, "tp 2 x pp 2 rerun");
  const RunOutcome baseline =
      run_on(4, with({"parallel.holders=0", "parallel.tp=2", "parallel.pp=2",
                      "parallel.micro_batches=2"}, kCuda),
             "tp2pp2-baseline");
  expect_identical(baseline, tp_pp, "the baseline at tp 2 x pp 2");
}

TEST_F(GpuTraining, RerunGivesTheSameCrc) {
  const RunOutcome a = run_on(3, with({"parallel.holders=1"}, kCuda), "rerun-a");
  const RunOutcome b = run_on(3, with({"parallel.holders=1"}, kCuda), "rerun-b");
  expect_identical(b, a, "dp 2 rerun");
}

}  // namespace
}  // namespace pdtrain::test
