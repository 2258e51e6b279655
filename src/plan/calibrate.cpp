// `pdtrain plan --calibrate OUT.toml`: measures what the model needs of this machine with the
// code training runs (the GEMM backend's kernels::gemm, optim's AdamW element loop, core's
// CRC32C, MPI point-to-point between two ranks of the job) and writes a machine file.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <utility>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/host_info.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/io/output_file.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/kernels/gemm.hpp"
#include "pdtrain/kernels/kernel_profile.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/plan/model.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/plan/command.hpp"
#include "pdtrain/plan/machine.hpp"

namespace pdtrain::plan {

namespace {

using Clock = std::chrono::steady_clock;

// Seconds per call of `f` over kReps short repetitions, each calling `f` for at least kRepeat
// seconds (at least once): the fastest repetition (Pick::best) or the middle one
// (Pick::typical). The holders' and memory's rates take the best: a neighbour's process takes
// time slices from some repetitions but cannot make any of them faster than the machine. The
// compute ranks' kernels take the typical one: a training step runs for a long time on a VM
// whose speed moves by 10-20 % from second to second (turbo, the host's other guests), and the
// best of short repetitions caught its fast moments (the calibrated peak moved by 19 % between
// two runs minutes apart while the runs' steps moved by 10 %, and every prediction was short).
// A sustained average on a shared machine would measure the neighbours (a GEMM efficiency of
// 0.002 once); the middle of five does not.
constexpr int kReps = 5;
// GEMM sizes of the curve: 1024 (2 x 10^9 flops a product) is past where one core's rate
// levels off, and keeps the calibration to a few seconds; the curve is held beyond its ends.
constexpr std::array<int, 5> kGemmSizes = {64, 128, 256, 512, 1024};
constexpr double kRepeat = 0.02;  // seconds: short enough to fit in a time slice's gap

enum class Pick { best, typical };

double pick_of(std::vector<double> seconds, Pick pick) {
  std::sort(seconds.begin(), seconds.end());
  return pick == Pick::best ? seconds.front() : seconds[seconds.size() / 2];
}

template <class F>
double per_call(Pick pick, F&& f) {
  std::vector<double> reps;
  for (int r = 0; r < kReps; ++r) {
    const auto t0 = Clock::now();
    long calls = 0;
    double elapsed = 0;
    do {
      f();
      ++calls;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (elapsed < kRepeat);
    reps.push_back(elapsed / static_cast<double>(calls));
  }
  return pick_of(std::move(reps), pick);
}

// The median (`best` false) or the fastest of `reps` timings of `f` (a fixed count: both
// ranks of a ping-pong must agree).
template <class F>
double time_of(int reps, bool best, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return best ? t.front() : t[t.size() / 2];
}

// flop/s of the three products of a linear layer of width n over n tokens, as training does
// them (forward x.W^T, input gradient dy.W, weight gradient dy^T.x: NT, NN and TN), on the
// calling thread's BLAS threads; fp32 or bf16 inputs. Each call takes the next of several
// operand sets that together span kColdBytes, beyond the last-level cache, so that every
// product reads its operands from memory as in a training step, whose activations (tens to
// hundreds of MiB) a layer touched last a layer earlier: the same products on operands hot in
// the cache run up to 1.6x faster here (AMD EPYC, n = 64..1024) and predicted steps too short.
constexpr std::size_t kColdBytes = std::size_t{64} << 20;

// The GEMM inputs' values as T (bf16: rounded as everywhere, core/bf16.hpp).
template <class T>
T input_value(float x) {
  if constexpr (std::is_same_v<T, bf16>)
    return to_bf16(x);
  else
    return x;
}

template <class T>
double gemm_rate(int n) {
  const std::size_t elems = static_cast<std::size_t>(n) * n;
  const std::size_t sets = std::max<std::size_t>(1, kColdBytes / (elems * (2 * sizeof(T) + sizeof(float))));
  std::vector<std::vector<T>> a(sets), b(sets);
  std::vector<std::vector<float>> c(sets);
  for (std::size_t s = 0; s < sets; ++s) {
    a[s].resize(elems), b[s].resize(elems), c[s].assign(elems, 0.0f);
    for (std::size_t i = 0; i < elems; ++i) a[s][i] = input_value<T>(0.001f * static_cast<float>(i % 1000)), b[s][i] = a[s][i];
  }
  double seconds = 0;
  std::size_t next = 0;
  for (const auto& [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}}) {
    auto product = [&, ta = ta, tb = tb] {
      const std::size_t s = next++ % sets;
      kernels::gemm(ta, tb, n, n, n, 1.0f, a[s].data(), n, b[s].data(), n, 0.0f, c[s].data(), n);
    };
    product();  // warm up (oneDNN creates the primitive at the first call of a shape)
    seconds += per_call(Pick::typical, product);
  }
  return 3 * 2.0 * n * n * n / seconds;
}

// STREAM-like triad over every core: bytes/s of the node's memory.
double triad_bandwidth(int threads) {
  const std::size_t n = std::size_t{1} << 24;  // 3 x 64 MiB: well past the caches
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 0.0f);
  const double s = per_call(Pick::best, [&] {
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        const std::size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        for (std::size_t i = lo; i < hi; ++i) c[i] = a[i] + 3.0f * b[i];
      });
    for (auto& th : pool) th.join();
  });
  return 12.0 * static_cast<double>(n) / s;
}

// Parameters/s of AdamW's element loop on one core (the holders' arithmetic).
double adamw_rate() {
  const std::int64_t n = 1 << 22;
  std::vector<float> g(n, 1e-3f), p(n, 0.5f), m(n, 0.0f), v(n, 0.0f);
  const AdamWStep k = adamw_step(AdamWConfig{}, 1, 1e-3, 1.0f, true);
  return static_cast<double>(n) / per_call(Pick::best, [&] { adamw_elements(k, g.data(), p.data(), m.data(), v.data(), n); });
}

double crc_rate() {
  std::vector<unsigned char> buf(std::size_t{1} << 26, 7);
  volatile std::uint32_t sink = 0;
  const double s = per_call(Pick::best, [&] { sink = crc32c(buf.data(), buf.size()); });
  (void)sink;
  return static_cast<double>(buf.size()) / s;
}

// One-way latency and bandwidth between ranks 0 and 1 (ping-pong of 8 bytes and of 16 MiB).
// Ranks beyond 1 wait quietly (a spinning MPI wait would take a core from the measurement).
void ping_pong(MPI_Comm comm, int rank, double* latency, double* bandwidth) {
  auto round_trips = [&](std::vector<char>& buf, int reps, bool best) {
    const int count = static_cast<int>(buf.size());
    return time_of(reps, best, [&] {
      MPI_Request r;
      if (rank == 0) {
        MPI_CHECK(MPI_Send(buf.data(), count, MPI_BYTE, 1, 7, comm));
        MPI_CHECK(MPI_Irecv(buf.data(), count, MPI_BYTE, 1, 7, comm, &r));
        wait_quietly(&r);
      } else if (rank == 1) {
        MPI_CHECK(MPI_Irecv(buf.data(), count, MPI_BYTE, 0, 7, comm, &r));
        wait_quietly(&r);
        MPI_CHECK(MPI_Send(buf.data(), count, MPI_BYTE, 0, 7, comm));
      }
    });
  };
  std::vector<char> small(8), large(std::size_t{1} << 24);
  // Latency: the median of many (robust, and a best of 200 would be one lucky wake-up);
  // bandwidth: the fastest of a few (a time slice lost to a neighbour is not the link's).
  const double t_small = round_trips(small, 200, false) / 2;
  const double t_large = round_trips(large, 5, true) / 2;
  *latency = t_small;
  *bandwidth = static_cast<double>(large.size()) / std::max(1e-9, t_large - t_small);
  double both[2] = {*latency, *bandwidth};
  MPI_CHECK(MPI_Bcast(both, 2, MPI_DOUBLE, 0, comm));
  *latency = both[0], *bandwidth = both[1];
}

// A machine file's node.wait_core_share is below 1 (a waiting rank does not compute).
constexpr double kMaxWaitShare = 0.9;

// The share of a core a rank takes while it waits quietly for a message (core/quiet_wait: it
// polls MPI, then sleeps up to 200 us; each timer wake-up costs CPU time, 25-30 us in a KVM
// guest). Rank 1 waits for a message that rank 0 sends after 0.2 s asleep, so that rank 1's core
// is otherwise idle, as a holder's is between steps; the waiting thread's CPU time over the
// wait, the middle of 3, at most kMaxWaitShare (a machine file holds a share below 1). Ranks
// beyond 1 wait quietly too, unmeasured.
double wait_core_share(MPI_Comm comm, int rank) {
  auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  std::vector<double> shares;
  for (int r = 0; r < 3; ++r) {
    MPI_Request req;
    MPI_CHECK(MPI_Ibarrier(comm, &req));
    wait_quietly(&req);
    char byte = 0;
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      MPI_CHECK(MPI_Send(&byte, 1, MPI_BYTE, 1, 9, comm));
    } else if (rank == 1) {
      MPI_CHECK(MPI_Irecv(&byte, 1, MPI_BYTE, 0, 9, comm, &req));
      const auto t0 = Clock::now();
      const double c0 = cpu_seconds();
      wait_quietly(&req);
      const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
      shares.push_back((cpu_seconds() - c0) / wall);
    }
  }
  double share = rank == 1 ? std::min(kMaxWaitShare, pick_of(std::move(shares), Pick::typical)) : 0;
  MPI_CHECK(MPI_Bcast(&share, 1, MPI_DOUBLE, 1, comm));
  return share;
}

// The rate of the model's elementwise kernels on the calling thread, in the bytes the model
// counts for them (plan::forward_elementwise_bytes; backward twice the forward) per second.
// The GEMM curve and a STREAM triad do not say it: on a CPU these kernels run on one thread
// and several are bound by arithmetic, not memory (GELU's tanh, the softmax's exp: 4-5 GB/s
// against a one-core triad of 15), and a layer also zeroes its gradient buffers; with the triad
// in their place the model's steps were 15-40 % short of the runs (perf/RESULTS.md). So this
// runs what training runs: a one-layer stage (GptStage on the CPU kernels) forward and
// backward, and divides the counted bytes by its time less its GEMMs' (the regions
// kernels::gemm opens, through KernelProfile): the middle of kReps repetitions, as the GEMMs.
double elementwise_rate() {
  ModelConfig cfg;
  cfg.n_layer = 1, cfg.n_head = 6, cfg.d_model = 384, cfg.vocab_size = 256, cfg.seq_len = 128;
  const std::int64_t B = 4;
  const ModelShape shape = resolve_model_shape(cfg);
  const ParamCatalog cat(shape);
  const StageSpec spec{0, shape.n_layer, true, true, 1, 0};
  StageParams params(cat, spec);
  std::vector<float> block;
  for (int id : params.needed_blocks()) {
    const BlockInfo& b = cat.block(id);
    block.resize(static_cast<std::size_t>(b.numel()));
    cat.init_block(b, 0.02, 1, block.data());
    params.unpack_param(b, block.data());
  }
  params.upload_params();
  NoTensorParallel tp;
  GptStage stage(params, B, cfg.seq_len, tp);
  const std::int64_t N = B * cfg.seq_len;
  std::vector<std::int32_t> tokens(N), targets(N);
  for (std::int64_t i = 0; i < N; ++i) {
    tokens[i] = static_cast<std::int32_t>(rng_below(rng_key(5), static_cast<std::uint64_t>(i), 256));
    targets[i] = static_cast<std::int32_t>(rng_below(rng_key(6), static_cast<std::uint64_t>(i), 256));
  }
  kernels::KernelProfile profile;
  auto step = [&] {
    stage.forward(0, tokens.data(), nullptr, targets.data());
    (void)stage.take_loss_sum();
    stage.backward(0, 1.0f / static_cast<float>(N), nullptr);
  };
  step();  // warm up (oneDNN creates its primitives at the first call of a shape)
  std::vector<double> reps;
  for (int r = 0; r < kReps; ++r) {
    params.zero_grads();
    profile.record(true);
    const auto t0 = Clock::now();
    step();
    const double total = std::chrono::duration<double>(Clock::now() - t0).count();
    profile.record(false);
    reps.push_back(total - profile.gemm_seconds());
    profile.take();
  }
  const double typical = pick_of(std::move(reps), Pick::typical);  // as the GEMMs
  PDT_CHECK(typical > 0, "calibration: a layer's elementwise time came out as zero");
  return 3 * forward_elementwise_bytes(shape, spec, static_cast<double>(B), ActivationTraffic{}).total() /
         typical;
}

// One BLAS thread's fp32 GEMM rate at each size, the bf16 rate at the largest and the
// elementwise kernels' rate, measured on every rank of `comm` at once and averaged over them (collective). A run keeps every core of
// its node busy, computing or polling MPI (its waits yield only to runnable neighbours), and a
// core's GEMM rate here drops by a quarter when the other core is busy too (one thread of
// 512^3 products: 63-70 GFLOP/s alone, 45-50 beside another): measured alone, the rates
// promised steps 30 % shorter than the runs took. Run as many ranks as the node has cores.
std::vector<double> kernel_rates_all_busy(MPI_Comm comm, int size, double* bf16_rate,
                                          double* elementwise) {
  kernels::set_blas_threads(1);
  std::vector<double> rates;
  auto together = [&](auto measure) {
    MPI_CHECK(MPI_Barrier(comm));  // start together: every core busy while any is measured
    double r = measure(), sum = 0;
    MPI_CHECK(MPI_Allreduce(&r, &sum, 1, MPI_DOUBLE, MPI_SUM, comm));
    return sum / size;
  };
  for (int n : kGemmSizes) rates.push_back(together([n] { return gemm_rate<float>(n); }));
  *bf16_rate = together([] { return gemm_rate<bf16>(kGemmSizes.back()); });
  *elementwise = together([] { return elementwise_rate(); });
  return rates;
}

}  // namespace

void calibrate(const std::string& out, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size < 2)
    throw Error(ExitCode::deck, "pdtrain plan --calibrate measures MPI between two ranks: run it as "
                                "mpirun -np 2 pdtrain plan --calibrate " + out);
  Machine m;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // GEMMs on every rank at once (every core busy, as in a run).
  double bf16_rate = 0, elementwise = 0;
  const std::vector<double> rates = kernel_rates_all_busy(comm, size, &bf16_rate, &elementwise);
  // Then memory and the holders' rates, on rank 0 alone while the others wait quietly.
  MPI_Request barrier;
  if (rank != 0) {
    MPI_CHECK(MPI_Ibarrier(comm, &barrier));
    wait_quietly(&barrier);
  } else {
    // One BLAS thread: what each rank of a shared node runs (choose_blas_threads,
    // scripts/mpirun-local). The node's peak is its cores at the best one-core rate; the model
    // gives each compute rank its threads' share of it (docs/performance-model.md).
    const double ceiling = *std::max_element(rates.begin(), rates.end());
    m.device.peak_fp32 = cores * ceiling;
    m.device.peak_bf16 = cores * bf16_rate;
    m.device.elementwise_rate = cores * elementwise;
    for (std::size_t i = 0; i < rates.size(); ++i) {
      const double n = kGemmSizes[i];
      m.device.gemm.push_back({2.0 * n * n * n, std::min(1.0, rates[i] / ceiling)});
    }
    kernels::set_blas_threads(cores);
    m.device.memory_bandwidth = triad_bandwidth(cores);
    m.holder.adamw_params_per_core = adamw_rate();
    m.holder.crc_bytes_per_core = crc_rate();
    MPI_CHECK(MPI_Ibarrier(comm, &barrier));
    wait_quietly(&barrier);
  }
  double latency = 0, bandwidth = 0;
  ping_pong(comm, rank, &latency, &bandwidth);
  m.node.wait_core_share = wait_core_share(comm, rank);
  if (rank != 0) return;
  char host[256] = "this machine";
  gethostname(host, sizeof host - 1);
  m.name = "CPU node: " + cpu_model_name() + " (calibrated on " + host + ")";
  // Neighbours' load moves every figure (a shared machine): say how loaded it was.
  double load[3] = {0, 0, 0};
  const int got = getloadavg(load, 3);
  char busy[96];
  std::snprintf(busy, sizeof busy, "load average %.2f (1 min) on %d cores when calibrated", got > 0 ? load[0] : -1.0,
                std::max(1u, std::thread::hardware_concurrency()));
  m.sources = {"pdtrain plan --calibrate: GEMM rates of kernels::gemm (" + kernels::gemm_backend_description() +
                   ") on one thread, the three products of a linear layer (NT, NN, TN) of n x n x n, n = 64..1024, "
                   "operands cycled over 64 MiB (read from memory, as in a training step), the middle of 5 "
                   "repetitions of 0.02 s, on all " + std::to_string(size) + " ranks of the calibration at once (of " +
                   std::to_string(cores) + " cores) and averaged; peak = cores x the best one-thread rate, bf16 peak "
                   "= cores x the bf16-input rate at n = 1024",
               "elementwise_gbs: cores x one thread's rate of a one-layer stage's (GptStage, d_model 384, 6 heads, "
               "4 x 128 tokens) forward and backward less its GEMMs, in the bytes the model counts for its "
               "elementwise kernels (forward_elementwise_bytes, backward twice), the middle of 5, on all ranks at once",
               "memory bandwidth: a triad over 3 x 64 MiB on " + std::to_string(cores) +
                   " threads, the best of 5 repetitions of 0.02 s",
               "links: MPI ping-pong between two ranks of this node (8 bytes: latency, the median of 200; "
               "16 MiB: bandwidth, the best of 5); one node, so link.inter repeats link.intra",
               "holder rates: optim's AdamW element loop and core's CRC32C on one core, each the best of 5 repetitions",
               "wait_core_share: the CPU time of a rank's thread waiting quietly (core/quiet_wait) 0.2 s for a "
               "message, over the wait, the middle of 3, at most 0.9",
               busy};
  m.device.name = "CPU (" + std::to_string(cores) + " cores)";
  m.device.gpu = false;
  m.node.devices = 1;
  m.node.cpu_cores = cores;
  m.node.cpu_memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  m.device.memory_bytes = m.node.cpu_memory_bytes;
  m.node.cpu_memory_bandwidth = m.device.memory_bandwidth;
  m.intra = m.inter = LinkSpec{latency, bandwidth};
  const std::string text = machine_toml(m);
  write_file_atomically(out, text);
  std::fputs(text.c_str(), stdout);
}

}  // namespace pdtrain::plan
