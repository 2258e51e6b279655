// All-reduce and reduce-scatter bandwidth through the collectives seam (core/collectives.hpp),
// reported as nccl-tests does: algbw = bytes / time, busbw = algbw * 2(n-1)/n for an all-reduce
// and algbw * (n-1)/n for a reduce-scatter (bytes = the whole buffer), the bandwidth each link
// must carry, comparable across rank counts. Sizes are the messages GPT-2 124M and 1.5B send:
// a micro-batch's activation for a tensor-parallel all-reduce (4 x 1024 tokens x d_model) and
// one layer's gradient for the data-parallel reduce (12 d_model^2 + 13 d_model floats), plus
// small messages where latency dominates.
//
//   mpirun -np N perf/bench_collectives [--transport mpi|nccl] [--short] [--iters K]
// mpi: host memory, the fixed-order sums (what CPU compute ranks, and GPU ranks through host
// staging, use). nccl: device memory on each rank's GPU (node-local rank k: GPU k), CUDA builds
// with NCCL only. --short: two small sizes and a check that the sums are the rank-order sums.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/device/nccl_collectives.hpp"
#include "pdtrain/kernels/backend_registry.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace {

using namespace pdtrain;

struct Options {
  std::string transport = "mpi";
  bool short_run = false;
  int iters = 5;
};

struct Size {
  const char* label;
  std::int64_t floats;
};

std::int64_t layer_floats(std::int64_t c) { return 12 * c * c + 13 * c; }

std::vector<Size> sizes(bool short_run) {
  if (short_run) return {{"small", 1024}, {"64k", 65536}};
  return {{"1k", 256},
          {"64k", 16384},
          {"1M", 262144},
          {"124M_tp_activation", 4 * 1024 * 768},
          {"124M_layer_grad", layer_floats(768)},
          {"1.5B_tp_activation", 4 * 1024 * 1600},
          {"1.5B_layer_grad", layer_floats(1600)}};
}

// The buffer a transport reduces: host memory for MPI, the GPU's memory for NCCL.
struct Memory {
  kernels::ComputeBackend backend;  // NCCL: this rank's GPU
  std::unique_ptr<Buffer<float>> device;
  std::vector<float> host;
  float* data(std::int64_t n) {
    if (!backend.device || backend.device->is_host()) {
      host.resize(static_cast<std::size_t>(n));
      return host.data();
    }
    if (!device || device->size() < n)
      device = std::make_unique<Buffer<float>>(*backend.device, n, MemoryKind::device);
    return device->data();
  }
  void fill(float* p, std::int64_t n, int rank) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) v[i] = static_cast<float>((i + rank) % 7) * 0.5f;
    copy_in(p, v.data(), n);
  }
  void copy_in(float* p, const float* from, std::int64_t n) {
    if (p == from) return;
    if (backend.device && !backend.device->is_host()) {
      backend.device->copy(p, from, static_cast<std::size_t>(n) * sizeof(float));
      backend.device->synchronize();
    } else {
      std::copy_n(from, n, p);
    }
  }
  std::vector<float> read(const float* p, std::int64_t n) {
    std::vector<float> v(static_cast<std::size_t>(n));
    if (backend.device && !backend.device->is_host()) {
      backend.device->copy(v.data(), p, static_cast<std::size_t>(n) * sizeof(float));
      backend.device->synchronize();
    } else {
      std::copy_n(p, n, v.begin());
    }
    return v;
  }
  void wait() {
    if (backend.device) backend.device->synchronize();
  }
};

int node_local_rank() {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  const int r = comm_rank(node);
  MPI_Comm_free(&node);
  return r;
}

std::unique_ptr<Collectives> make_transport(const Options& o, Memory& mem) {
  if (o.transport == "mpi") return std::make_unique<MpiCollectives>(MPI_COMM_WORLD);
  mem.backend =
      kernels::make_backend("cuda", node_local_rank() % std::max(1, kernels::cuda_device_count()));
  NcclId id{};
  if (comm_rank(MPI_COMM_WORLD) == 0) id = make_nccl_id();
  MPI_CHECK(MPI_Bcast(id.data(), static_cast<int>(id.size()), MPI_BYTE, 0, MPI_COMM_WORLD));
  return make_nccl_collectives(*mem.backend.device, comm_rank(MPI_COMM_WORLD),
                               comm_size(MPI_COMM_WORLD), id, "world",
                               ParallelConfig{}.nccl_timeout_s);  // the deck's default watchdog
}

// Best of `iters` timed calls (after one warm-up), the slowest rank's time of each.
template <class Op>
double best_seconds(int iters, Memory& mem, Op&& op) {
  op();
  mem.wait();
  double best = 1e30;
  for (int k = 0; k < iters; ++k) {
    MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
    const auto t0 = std::chrono::steady_clock::now();
    op();
    mem.wait();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD));
    best = std::min(best, t);
  }
  return best;
}

void report(const char* op, const Options& o, int n, const Size& s, double t, double bus_factor) {
  const double bytes = static_cast<double>(s.floats) * sizeof(float);
  const double algbw = bytes / t / 1e9;
  std::printf("%-13s transport=%s ranks=%d size=%-18s bytes=%-10.0f time_us=%-10.1f "
              "algbw_GBps=%-7.3f busbw_GBps=%.3f\n",
              op, o.transport.c_str(), n, s.label, bytes, t * 1e6, algbw, algbw * bus_factor);
}

// The sums must be the rank-order sums (exact here: small integers and halves).
bool check_sums(Collectives& c, Memory& mem) {
  const std::int64_t n = 1000;
  float* p = mem.data(n);
  mem.fill(p, n, c.rank());
  c.allreduce_sum(p, n);
  const std::vector<float> got = mem.read(p, n);
  for (std::int64_t i = 0; i < n; ++i) {
    float want = 0.0f;
    for (int r = 0; r < c.size(); ++r) want += static_cast<float>((i + r) % 7) * 0.5f;
    if (got[i] != want) {
      std::printf("FAIL: element %lld is %g, the rank-order sum is %g\n",
                  static_cast<long long>(i), got[i], want);
      return false;
    }
  }
  return true;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--short") o.short_run = true;
    else if (a == "--transport" && i + 1 < argc) o.transport = argv[++i];
    else if (a == "--iters" && i + 1 < argc) o.iters = std::max(1, std::atoi(argv[++i]));
    else throw Error(ExitCode::deck, "usage: bench_collectives [--transport mpi|nccl] [--short] [--iters K]");
  }
  if (o.transport != "mpi" && o.transport != "nccl")
    throw Error(ExitCode::deck, "--transport must be mpi or nccl");
  if (o.short_run) o.iters = std::min(o.iters, 3);
  return o;
}

int run(const Options& o) {
  Memory mem;
  std::unique_ptr<Collectives> c = make_transport(o, mem);
  const int n = c->size(), me = c->rank();
  if (me == 0)
    std::printf("bench_collectives: %s, %d ranks, best of %d\n", c->transport(), n, o.iters);
  const bool ok = check_sums(*c, mem);
  for (const Size& s : sizes(o.short_run)) {
    float* p = mem.data(s.floats);
    mem.fill(p, s.floats, me);
    const double ar = best_seconds(o.iters, mem, [&] { c->allreduce_sum(p, s.floats); });
    const std::vector<std::int64_t> counts = split_evenly(s.floats, n);
    const double rs = best_seconds(o.iters, mem, [&] { c->reduce_scatter(p, counts); });
    if (me == 0) {
      report("allreduce", o, n, s, ar, 2.0 * (n - 1) / n);
      report("reducescatter", o, n, s, rs, static_cast<double>(n - 1) / n);
    }
  }
  int all_ok = ok ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (me == 0) std::printf(all_ok ? "bench_collectives: ok\n" : "FAIL: bench_collectives\n");
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  pdtrain::init_mpi(&argc, &argv);
  int rc = 0;
  try {
    rc = run(parse(argc, argv));
  } catch (const pdtrain::Error& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    rc = static_cast<int>(e.code());
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
  MPI_Finalize();
  return rc;
}
