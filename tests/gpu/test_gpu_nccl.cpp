// NCCL between compute ranks (parallel.comm), on the GPUs of this node (ctest label gpu;
// skipped without a GPU; 5 ranks):
//  - one compute rank on NCCL (a communicator of one: nothing to add) is the MPI path bit for
//    bit, as the replicated baseline and under PD;
//  - compute ranks sharing a GPU cannot use NCCL: "auto" falls back to MPI (the same bits as
//    "mpi"), "nccl" is an error naming the deck key and the shared GPU;
//  - with two GPUs, tp 2 over NCCL is the MPI path bit for bit (a sum of two is the same in
//    either order, and the ring's last phase copies), and a rerun repeats its bits.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../mpi/run_helpers.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/device/nccl_collectives.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::test {
namespace {

const std::string kDeck =
    tiny_deck({"run.seed=5", "model.n_head=4", "model.d_model=64", "model.vocab_size=96",
               "model.seq_len=16", "train.batch_size=4", "run.steps=8"});

std::vector<std::string> cuda(const std::string& comm, std::vector<std::string> more = {}) {
  more.push_back("compute.device=cuda");
  more.push_back("parallel.comm=" + comm);
  return more;
}

RunOutcome run_on(int ranks, const std::vector<std::string>& sets, const std::string& tag) {
  return first_group_run(kDeck, ranks, sets, temp_path("nccl-" + tag));
}

void expect_identical(const RunOutcome& got, const RunOutcome& ref, const std::string& what) {
  ASSERT_FALSE(ref.losses.empty()) << what;
  EXPECT_EQ(got.losses, ref.losses) << what;
  EXPECT_EQ(got.crc, ref.crc) << what;
}

// The error a run on the first `ranks` ranks ends with (every rank learns rank 0's).
struct RunError {
  int code = 0;
  std::string message;
};
RunError error_of(int ranks, const std::vector<std::string>& sets, const std::string& tag) {
  RunError e;
  MPI_Comm g = group_of(MPI_COMM_WORLD, ranks, 1);
  if (g != MPI_COMM_NULL) {
    std::vector<std::string> s = sets;
    s.push_back("run.out_dir=" + temp_path("nccl-" + tag));
    try {
      run_deck(kDeck, s, g);
    } catch (const Error& err) {
      e.code = static_cast<int>(err.code());
      e.message = err.what();
    }
    MPI_Comm_free(&g);
  }
  char text[512] = {};
  std::strncpy(text, e.message.c_str(), sizeof text - 1);
  MPI_Bcast(&e.code, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Bcast(text, sizeof text, MPI_CHAR, 0, MPI_COMM_WORLD);
  e.message = text;
  return e;
}

// Whether the compute ranks of a run on the first `ranks` ranks (rank 0 the holder, all on this
// node) each have a GPU of their own: compared by UUID, as pdtrain compares them, so that one
// GPU visible per rank (CUDA_VISIBLE_DEVICES set per rank, as Slurm's GPU binding does) counts
// as GPUs of their own although every rank calls its GPU "0".
bool own_gpus(int ranks) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int gpus = kernels::cuda_device_count();
  std::string uuid = gpus > 0 && rank > 0 ? kernels::cuda_gpu_uuid((rank - 1) % gpus) : "";
  uuid.resize(64, '\0');
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<char> all(64 * static_cast<std::size_t>(size));
  MPI_Allgather(uuid.data(), 64, MPI_CHAR, all.data(), 64, MPI_CHAR, MPI_COMM_WORLD);
  std::vector<std::string> seen;
  for (int r = 1; r < ranks; ++r) {
    const std::string u(all.data() + 64 * r);
    if (u.empty() || std::find(seen.begin(), seen.end(), u) != seen.end()) return false;
    seen.push_back(u);
  }
  return true;
}

bool gpu0_shareable() {
  int ok = kernels::cuda_gpu_shareable(0) ? 1 : 0, all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}

TEST(GpuNccl, TheCudaBuildHasNccl) {
  EXPECT_TRUE(nccl_built());
  EXPECT_FALSE(nccl_version().empty());
}

TEST(GpuNccl, OneComputeRankOnNcclIsTheMpiPathBitForBit) {
  expect_identical(run_on(1, cuda("nccl"), "one-nccl"), run_on(1, cuda("mpi"), "one-mpi"),
                   "baseline, one rank");
  expect_identical(run_on(2, cuda("nccl", {"parallel.holders=1"}), "pd-nccl"),
                   run_on(2, cuda("mpi", {"parallel.holders=1"}), "pd-mpi"), "PD, one compute rank");
}

TEST(GpuNccl, RanksSharingAGpuFallBackToMpi) {
  // 1 holder + tp 2 x pp 2: four compute ranks on this node.
  if (own_gpus(5)) GTEST_SKIP() << "this node has a GPU for each of the 4 compute ranks";
  if (!gpu0_shareable()) GTEST_SKIP() << "GPU 0 is not in the Default compute mode: ranks cannot share it";
  const std::vector<std::string> grid = {"parallel.holders=1", "parallel.tp=2", "parallel.pp=2",
                                         "parallel.micro_batches=2"};
  expect_identical(run_on(5, cuda("auto", grid), "shared-auto"),
                   run_on(5, cuda("mpi", grid), "shared-mpi"), "auto on a shared GPU");
  const RunError e = error_of(5, cuda("nccl", grid), "shared-nccl");
  EXPECT_EQ(e.code, static_cast<int>(ExitCode::layout)) << e.message;
  EXPECT_NE(e.message.find("parallel.comm: nccl, but 4 compute ranks on node 0 share its"),
            std::string::npos)
      << e.message;
}

TEST(GpuNccl, TensorParallelOverNcclIsTheMpiPathBitForBit) {
  if (!own_gpus(3)) GTEST_SKIP() << "needs a GPU of its own for each of the two tp ranks";
  const std::vector<std::string> tp2 = {"parallel.holders=1", "parallel.tp=2"};
  const RunOutcome nccl = run_on(3, cuda("nccl", tp2), "tp2-nccl");
  expect_identical(nccl, run_on(3, cuda("mpi", tp2), "tp2-mpi"), "tp 2");
  expect_identical(run_on(3, cuda("nccl", tp2), "tp2-nccl-again"), nccl, "tp 2 rerun");
}

}  // namespace
}  // namespace pdtrain::test
