#pragma once
// A holder's arithmetic per step, spread over the cores it is given (pd.holder_threads):
//
// - `reduce_gradient`: when a block's last contribution for a step arrives, its contributions
//   are summed in source-rank order and its sum of squares is taken at once (chunks in
//   parallel, added in adamw_math.hpp's chunk order), so when a step's last push arrives only
//   the norm agreement remains;
// - `FusedUpdate`: AdamW, the wire encoding and its CRC32C in one pass per slice of
//   kUpdateSliceFloats elements (cache-resident), slices of every block spread over the pool in
//   block order, each block's CRC assembled from its slices' in slice order.
//
// Both give the serial code's bits for any thread count: AdamW is per element, the sums of
// squares add the same chunk sums in the same order, and crc32c_combine is exact.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/staleness.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

// Elements per slice of the fused update: 32 KiB of parameters; with m, v, the gradient and
// the encoded bytes about 160 KiB touched, which stays in a core's L2 between the update, the
// encoding and the CRC.
constexpr std::int64_t kUpdateSliceFloats = 8192;
// pd.holder_threads = 0 uses the cores this process may run on, at most this many (beyond, the
// update is memory-bound and more threads only contend).
constexpr int kMaxAutoHolderThreads = 32;

// The cores this process may run on (sched_getaffinity), at least 1.
int usable_cores();
// `configured` threads, or with 0: the cores this process is bound to; unbound (its affinity is
// every online CPU, e.g. mpirun --bind-to none), its share of them among the `ranks_on_node`
// ranks of its node, so that a holder does not take compute ranks' cores. At least 1, at most
// kMaxAutoHolderThreads.
int resolve_holder_threads(int configured, int ranks_on_node = 1);

// A fixed set of threads running one batch of numbered tasks at a time; tasks are taken in
// increasing order, so earlier work (earlier blocks) finishes first. Idle workers sleep.
class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()); }
  // Runs task(0) .. task(n-1) on the workers and returns at once; the previous batch must have
  // been waited for.
  void start(std::int64_t n, std::function<void(std::int64_t)> task);
  // Returns once every task of the current batch has finished.
  void wait();
  // Runs the batch with the calling thread taking tasks too; returns when all have finished.
  void run(std::int64_t n, std::function<void(std::int64_t)> task);
  // Runs one task of the current batch on the calling thread, if one is left to start; returns
  // whether it did.
  bool help();

 private:
  void work();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::function<void(std::int64_t)> task_;
  std::int64_t next_ = 0, count_ = 0, done_ = 0;
  bool stopping_ = false;
};

// Adds `others` into `sum` element by element, in the order given (sum = ((c0 + c1) + c2)...,
// the order of the serial sum over source ranks), and returns the sum of squares of the result
// (sum_of_squares' bits). With a pool, ranges of chunks run in parallel; null: serially.
double reduce_gradient(WorkerPool* pool, float* sum, const std::vector<const float*>& others,
                       std::int64_t n);

// A raw-coded gradient block as pushed (`n` floats at `wire`, any alignment) copied into `dest`
// in one pass that also takes the CRC32C of the bytes received (returned; crc32c's value) and,
// when `sumsq` is given, the copy's sum of squares (sum_of_squares' bits). A corrupt push is
// detected after the copy, which is harmless: it ends the job. Parallel like reduce_gradient.
std::uint32_t ingest_raw_gradient(WorkerPool* pool, const char* wire, float* dest, std::int64_t n,
                                  double* sumsq);

// One step's update of a list of blocks. Blocks complete roughly in list order; `done(i)` says
// whether block i has its new parameters, encoding and CRC.
class FusedUpdate {
 public:
  struct Block {
    BlockState* state = nullptr;
    const float* grad = nullptr;  // summed over sources, not yet clipped
    AdamWStep step;
    // Where the wire bytes go (resized here), or `wire_at` when they have a fixed place (a
    // slot of the holder's shared segment, n x wire bytes; raw and bf16). Both null only for
    // the raw codec: the wire bytes are then the parameters themselves and only their CRC is
    // computed.
    std::vector<char>* encoded = nullptr;
    char* wire_at = nullptr;
    std::uint32_t crc = 0;  // of the wire bytes, once done
    // Served extrapolated as `Prediction` says (pd/staleness.hpp); exact() serves the
    // parameters. The prediction needs `encoded` (a raw or bf16 copy, or lz4 compressed from
    // `predicted`).
    Prediction predict;
    std::vector<float>* predicted = nullptr;  // lz4 only: the extrapolated floats, sized here
  };

  FusedUpdate(WireCodec codec, std::vector<Block> blocks,
              std::int64_t slice_floats = kUpdateSliceFloats);
  FusedUpdate(const FusedUpdate&) = delete;
  FusedUpdate& operator=(const FusedUpdate&) = delete;

  // Queues every slice on the pool and returns; the pool must outlive the update.
  void start(WorkerPool& pool);
  // Serially on the calling thread, in block order (the single-threaded reference).
  void run_here();
  // The next slice, on the calling thread, for an update that was not started on a pool (one
  // thread that interleaves slices with other work); false once every slice has run.
  bool run_next_here();
  bool done(std::size_t i) const { return state_[i].done.load(std::memory_order_acquire); }
  // Blocks completed so far (in any order).
  std::int64_t completed();
  // Waits until more than `seen` blocks have completed or `timeout` passes.
  void wait_for_progress(std::int64_t seen, std::chrono::microseconds timeout);
  const Block& block(std::size_t i) const { return blocks_[i]; }
  std::size_t size() const { return blocks_.size(); }

 private:
  struct Progress {
    std::atomic<std::int64_t> slices_left{0};
    std::atomic<bool> done{false};
    std::vector<std::uint32_t> slice_crc;
  };
  void run_slice(std::int64_t task);
  const void* run_predicted_slice(Block& blk, std::int64_t begin, std::int64_t n);
  void finish_block(std::size_t b);
  // The block's wire copy (encoded or wire_at), or null when it is served in place.
  static char* wire_copy(const Block& blk);

  std::size_t next_here_ = 0;  // run_next_here's next slice
  WireCodec codec_;
  std::vector<Block> blocks_;
  std::int64_t slice_;
  std::unique_ptr<Progress[]> state_;
  std::vector<std::pair<std::size_t, std::int64_t>> tasks_;  // (block, first element)
  std::mutex mutex_;
  std::condition_variable progress_;
  std::int64_t completed_ = 0;
};

// The bytes per element a codec's wire form takes in the fused update (raw 4, bf16 2); 0 for
// codecs encoded per block after the update (lz4).
int fused_wire_bytes(WireCodec codec);

}  // namespace pdtrain
