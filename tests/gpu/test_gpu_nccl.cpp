// NCCL between compute ranks (parallel.comm), on the GPUs of this node (ctest label gpu;
// skipped without a GPU; 5 ranks):
//  - one compute rank on NCCL (a communicator of one: nothing to add) is the MPI path bit for
//    bit, as the replicated baseline and under PD;
//  - compute ranks sharing a GPU cannot use NCCL: "auto" falls back to MPI (the same bits as
//    "mpi"), "nccl" is an error naming the deck key and the shared GPU;
//  - with two GPUs, tp 2 over NCCL is the MPI path bit for bit, and a rerun repeats its bits;
//  - with a GPU per rank, the NCCL reduce-scatter, all-gather and all-reduce of four ranks are
//    the MPI path's bits (fixed rank order, on data whose sums depend on the order), run after
//    run; and the data-parallel gradient reduce (PD and the replicated baseline) and the
//    pipeline's messages over NCCL train to the MPI path's losses and params_crc32c.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../mpi/run_helpers.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/device/cuda_device.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/device/nccl_collectives.hpp"
#include "pdtrain/kernels/backend_registry.hpp"
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

// ------------------------------------------------------------- the collectives themselves

// Rank r's data: values of widely spread magnitudes, so that a sum of four depends on the
// order of its additions.
std::vector<float> spread_values(std::int64_t n, int rank) {
  std::mt19937 rng(1234u + 77u * static_cast<unsigned>(rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    x[i] = std::ldexp(u(rng), static_cast<int>((i * 7 + rank * 13) % 40) - 20);
  return x;
}

// The same as `a` bit for bit (NaN-safe, -0 told from +0). An empty segment's pointers may be
// null.
bool same_bits(const float* a, const float* b, std::int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<std::size_t>(n) * sizeof(float)) == 0;
}

class DeviceFloats {
 public:
  DeviceFloats(Device& device, std::int64_t n) : device_(device), buf_(device, n) {}
  float* data() { return buf_.data(); }
  void upload(const std::vector<float>& x) {
    device_.copy(buf_.data(), x.data(), x.size() * sizeof(float));
  }
  std::vector<float> download(const float* at, std::int64_t n) {
    std::vector<float> out(static_cast<std::size_t>(n));
    device_.copy(out.data(), at, out.size() * sizeof(float));
    device_.synchronize();
    return out;
  }

 private:
  Device& device_;
  Buffer<float> buf_;
};

// What ranks 1..4 found, shared with every rank (only rank 0 prints test results): 1 where
// every rank of the group found it, 0 where one did not.
struct SumChecks {
  int reduce_scatter = 1, reduce_scatter_again = 1, allgather = 1, allreduce = 1,
      allreduce_again = 1, device_memory = 1;
  int order_matters = 1 << 30;  // elements whose sum differs in reverse rank order (fewest)
};
static_assert(sizeof(SumChecks) == 7 * sizeof(int), "SumChecks travels as ints");

SumChecks nccl_sums_against_mpi(MPI_Comm group, int world) {
  constexpr int kRanks = 4;
  SumChecks c;
  int rank = 0;
  MPI_Comm_rank(group, &rank);
  kernels::ComputeBackend gpu =
      kernels::make_backend("cuda", (world - 1) % kernels::cuda_device_count());
  NcclId id{};
  if (rank == 0) id = make_nccl_id();
  MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group);
  std::unique_ptr<Collectives> nccl = make_nccl_collectives(*gpu.device, rank, kRanks, id, "dp",
                                                             /*stall_limit_s=*/600);
  MpiCollectives mpi(group);
  c.device_memory = nccl->device_memory();

  // Uneven segments, one of them empty.
  const std::vector<std::int64_t> counts = {300, 7, 0, 693};
  const std::int64_t n = 1000, mine = counts[static_cast<std::size_t>(rank)];
  const std::vector<float> x = spread_values(n, rank);
  const float* mpi_sum = mpi.reduce_scatter(x.data(), counts);
  const std::vector<float> want(mpi_sum, mpi_sum + mine);
  DeviceFloats in(*gpu.device, n), out(*gpu.device, n);
  in.upload(x);
  c.reduce_scatter =
      same_bits(in.download(nccl->reduce_scatter(in.data(), counts), mine).data(), want.data(), mine);
  c.reduce_scatter_again =
      same_bits(in.download(nccl->reduce_scatter(in.data(), counts), mine).data(), want.data(), mine);

  // The data must tell orders apart, or the equality above would prove nothing.
  std::vector<float> all(static_cast<std::size_t>(n * kRanks));
  MPI_Allgather(x.data(), static_cast<int>(n), MPI_FLOAT, all.data(), static_cast<int>(n),
                MPI_FLOAT, group);
  c.order_matters = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    float forward = all[i], reverse = all[(kRanks - 1) * n + i];
    for (int r = 1; r < kRanks; ++r) {
      forward += all[r * n + i];
      reverse += all[(kRanks - 1 - r) * n + i];
    }
    c.order_matters += forward != reverse;
  }

  // All-gather of the reduced segments: the MPI path's result on every rank.
  std::vector<float> gathered(static_cast<std::size_t>(n));
  mpi.allgather(want.data(), gathered.data(), counts);
  nccl->allgather(nccl->reduce_scatter(in.data(), counts), out.data(), counts);
  c.allgather = same_bits(out.download(out.data(), n).data(), gathered.data(), n);

  // The tensor-parallel all-reduce (n not a multiple of the ranks), twice.
  const std::int64_t m = 999;
  std::vector<float> y = spread_values(m, rank + 5);
  mpi.allreduce_sum(y.data(), m);
  for (int* ok : {&c.allreduce, &c.allreduce_again}) {
    in.upload(spread_values(m, rank + 5));
    nccl->allreduce_sum(in.data(), m);
    *ok = same_bits(in.download(in.data(), m).data(), y.data(), m);
  }
  return c;
}

TEST(GpuNccl, FixedOrderSumsAreTheMpiPathBitForBitRunAfterRun) {
  if (!own_gpus(5)) GTEST_SKIP() << "needs a GPU of its own for each of 4 ranks";
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world >= 1 && world <= 4 ? 0 : MPI_UNDEFINED, world, &group);
  SumChecks mine, all;
  if (group != MPI_COMM_NULL) {
    mine = nccl_sums_against_mpi(group, world);
    MPI_Comm_free(&group);
  }
  MPI_Allreduce(&mine, &all, sizeof(SumChecks) / sizeof(int), MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all.device_memory, 1);
  EXPECT_EQ(all.reduce_scatter, 1) << "NCCL's reduce-scatter differs from the MPI path's";
  EXPECT_EQ(all.reduce_scatter_again, 1) << "a second NCCL reduce-scatter differs";
  EXPECT_EQ(all.allgather, 1) << "NCCL's all-gather differs from the MPI path's";
  EXPECT_EQ(all.allreduce, 1) << "NCCL's all-reduce differs from the MPI path's";
  EXPECT_EQ(all.allreduce_again, 1) << "a second NCCL all-reduce differs";
  EXPECT_GT(all.order_matters, 10) << "the data does not tell summation orders apart";
}

// The NCCL watchdog (parallel.nccl_timeout_s) counts only time a communicator's work waits on
// its peers: with a limit of 2 s, a compute stream busy for 4 s before a NCCL all-reduce (its
// inputs not ready) and for 4 s after it (the NCCL stream idle), the host waiting throughout,
// must not end the job (a watchdog that timed from the posting, or any wait, would abort this
// process), and the all-reduce still sums. A stalled peer tripping it ends the job, which a
// test process cannot survive: cli.nccl_watchdog_ends_a_stalled_job shows that.
constexpr double kWatchdogLimitS = 2;
constexpr int kBusyMs = 4000;

void sleep_on_stream(void*) {
  std::this_thread::sleep_for(std::chrono::milliseconds(kBusyMs));
}

int long_compute_never_trips_the_watchdog(MPI_Comm group, int world) {
  int rank = 0;
  MPI_Comm_rank(group, &rank);
  kernels::ComputeBackend gpu =
      kernels::make_backend("cuda", (world - 1) % kernels::cuda_device_count());
  auto& cuda = dynamic_cast<CudaDevice&>(*gpu.device);
  NcclId id{};
  if (rank == 0) id = make_nccl_id();
  MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, group);
  std::unique_ptr<Collectives> nccl =
      make_nccl_collectives(cuda, rank, 2, id, "dp", kWatchdogLimitS);
  const std::int64_t n = 64;
  DeviceFloats data(cuda, n);
  data.upload(std::vector<float>(n, static_cast<float>(rank + 1)));
  cuda.synchronize();
  MPI_Barrier(group);  // both ranks' compute streams start their long work together
  const auto start = std::chrono::steady_clock::now();
  bool ok = cudaLaunchHostFunc(cuda.compute_stream(), sleep_on_stream, nullptr) == cudaSuccess;
  nccl->allreduce_sum(data.data(), n);
  ok = ok && cudaLaunchHostFunc(cuda.compute_stream(), sleep_on_stream, nullptr) == cudaSuccess;
  // The host waits throughout, polling the watches (a copy to pageable memory would block in
  // the runtime instead).
  cuda.synchronize();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const std::vector<float> sum = data.download(data.data(), n);
  return ok && std::all_of(sum.begin(), sum.end(), [](float v) { return v == 3.0f; }) &&
         waited > 2 * kBusyMs / 1000.0;  // the host did wait on both long stretches
}

TEST(GpuNccl, TheWatchdogIgnoresALongComputeWait) {
  if (!own_gpus(3)) GTEST_SKIP() << "needs a GPU of its own for each of two ranks";
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world == 1 || world == 2 ? 0 : MPI_UNDEFINED, world, &group);
  int mine = 1, all = 0;
  if (group != MPI_COMM_NULL) {
    mine = long_compute_never_trips_the_watchdog(group, world);
    MPI_Comm_free(&group);
  }
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  EXPECT_EQ(all, 1) << "the all-reduce between the long compute did not sum, or the host did "
                       "not wait on both stretches";
}

// ------------------------------------------------------------- training over NCCL

const std::vector<std::string> kShort = {"run.steps=3"};

std::vector<std::string> plus(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(GpuNccl, DataParallelReduceOverNcclIsTheMpiPathBitForBit) {
  if (!own_gpus(3)) GTEST_SKIP() << "needs a GPU of its own for each of two compute ranks";
  // The replicated baseline, dp 2: the gradients packed and summed on the GPUs.
  const std::vector<std::string> baseline = plus(kShort, {"parallel.holders=0"});
  expect_identical(run_on(2, cuda("nccl", baseline), "base-dp2-nccl"),
                   run_on(2, cuda("mpi", baseline), "base-dp2-mpi"), "baseline dp 2");
  // PD, one holder and dp 2: each unit summed on the GPUs as backward streams it out.
  const std::vector<std::string> pd = plus(kShort, {"parallel.holders=1"});
  const RunOutcome pd_nccl = run_on(3, cuda("nccl", pd), "pd-dp2-nccl");
  expect_identical(pd_nccl, run_on(3, cuda("mpi", pd), "pd-dp2-mpi"), "PD dp 2");
  expect_identical(run_on(3, cuda("nccl", pd), "pd-dp2-nccl-again"), pd_nccl, "PD dp 2 rerun");
}

TEST(GpuNccl, PipelineOverNcclIsTheMpiPathBitForBit) {
  if (!own_gpus(3)) GTEST_SKIP() << "needs a GPU of its own for each of two compute ranks";
  // PD, pp 2 (the tied embedding's two contributions summed by its holder), 1F1B over two
  // micro-batches: activations and their gradients go GPU to GPU.
  const std::vector<std::string> pp2 =
      plus(kShort, {"parallel.holders=1", "parallel.pp=2", "parallel.micro_batches=2"});
  expect_identical(run_on(3, cuda("nccl", pp2), "pp2-nccl"), run_on(3, cuda("mpi", pp2), "pp2-mpi"),
                   "pp 2");
}

TEST(GpuNccl, ReplicatedPipelineOverNcclIsTheMpiPathBitForBit) {
  if (!own_gpus(5)) GTEST_SKIP() << "needs a GPU of its own for each of four compute ranks";
  // dp 2 x pp 2 under PD: each stage's units summed over its replicas on the GPUs during
  // backward, between the pipeline's messages, on three NCCL groups at once.
  const std::vector<std::string> grid =
      plus(kShort, {"parallel.holders=1", "parallel.pp=2", "parallel.micro_batches=2"});
  expect_identical(run_on(5, cuda("nccl", grid), "dp2pp2-nccl"),
                   run_on(5, cuda("mpi", grid), "dp2pp2-mpi"), "dp 2 x pp 2");
}

TEST(GpuNccl, BaselineTensorAndPipelineOverNcclIsTheMpiPathBitForBit) {
  if (!own_gpus(5)) GTEST_SKIP() << "needs a GPU of its own for each of four compute ranks";
  // The replicated baseline at tp 2 x pp 2: the tp-replicated blocks' gradients (tp rank 0's to
  // the others) and the tied embedding's two stages' gradients (swapped and added) cross GPU to
  // GPU over NCCL, as the pipeline's messages and the tp all-reduces do.
  const std::vector<std::string> grid = plus(
      kShort, {"parallel.holders=0", "parallel.tp=2", "parallel.pp=2", "parallel.micro_batches=2"});
  const RunOutcome nccl = run_on(4, cuda("nccl", grid), "base-tp2pp2-nccl");
  expect_identical(nccl, run_on(4, cuda("mpi", grid), "base-tp2pp2-mpi"), "baseline tp 2 x pp 2");
  expect_identical(run_on(4, cuda("nccl", grid), "base-tp2pp2-nccl-again"), nccl,
                   "baseline tp 2 x pp 2 rerun");
}

}  // namespace
}  // namespace pdtrain::test
