#include "pdtrain/pd/holder_update.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"

// The build uses no -march flags: target_clones compiles the fused loops for AVX2 as well and
// the loader picks that clone on CPUs that have it. AVX2 brings no FMA and the project builds
// with -ffp-contract=off, so both clones round exactly as adamw_math.hpp says (the GPU's bits).
// This file is compiled with -fno-math-errno so that sqrtf vectorizes (same value either way).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define PDTRAIN_UPDATE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PDTRAIN_UPDATE_CLONES
#endif

namespace pdtrain {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

int resolve_holder_threads(int configured, int ranks_on_node) {
  PDT_CHECK(configured >= 0, "pd.holder_threads must be >= 0");
  if (configured > 0) return configured;
  const int cores = usable_cores();
  const bool bound = cores < sysconf(_SC_NPROCESSORS_ONLN);
  const int share = bound ? cores : cores / std::max(1, ranks_on_node);
  return std::clamp(share, 1, kMaxAutoHolderThreads);
}

// --- WorkerPool --------------------------------------------------------------------------------

WorkerPool::WorkerPool(int threads) {
  PDT_CHECK(threads >= 1, "a worker pool needs at least one thread");
  for (int t = 0; t < threads; ++t) workers_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void WorkerPool::start(std::int64_t n, std::function<void(std::int64_t)> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    PDT_CHECK(done_ == count_, "a worker pool batch started before the last one finished");
    task_ = std::move(task);
    next_ = 0;
    count_ = n;
    done_ = 0;
  }
  wake_.notify_all();
}

void WorkerPool::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [this] { return done_ == count_; });
}

// The caller takes tasks too: a small batch is often done before a sleeping worker wakes up,
// and the caller never waits on a hand-off.
void WorkerPool::run(std::int64_t n, std::function<void(std::int64_t)> task) {
  start(n, std::move(task));
  while (help()) {
  }
  wait();
}

bool WorkerPool::help() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (next_ >= count_) return false;
  const std::int64_t i = next_++;
  lock.unlock();
  task_(i);
  lock.lock();
  if (++done_ == count_) finished_.notify_all();
  return true;
}

void WorkerPool::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stopping_ || next_ < count_; });
    if (stopping_) return;
    const std::int64_t i = next_++;
    lock.unlock();
    task_(i);  // task_ is replaced only once every task of its batch is done
    lock.lock();
    if (++done_ == count_) finished_.notify_all();
  }
}

// --- Gradients: contributions summed, sum of squares --------------------------------------------

namespace {

// Chunks of kSumsqChunk elements per task of reduce_gradient: 64 KiB of gradient.
constexpr std::int64_t kChunksPerTask = 4;

// Adds the contributions into sum over [begin, end) and returns the chunk's sum of squares.
// The AVX2 clone keeps the 8 lanes in two 4-double registers: the same additions per lane.
PDTRAIN_UPDATE_CLONES double reduce_chunk(float* sum, const std::vector<const float*>& others,
                                          std::int64_t begin, std::int64_t end) {
  for (const float* o : others)
    for (std::int64_t i = begin; i < end; ++i) sum[i] += o[i];
  const auto at = [sum](std::int64_t i) { return sum[i]; };
  return sumsq_chunk(at, begin, end - begin);
}

}  // namespace

double reduce_gradient(WorkerPool* pool, float* sum, const std::vector<const float*>& others,
                       std::int64_t n) {
  const std::int64_t chunks = (n + kSumsqChunk - 1) / kSumsqChunk;
  std::vector<double> chunk_sumsq(static_cast<std::size_t>(chunks));
  const std::int64_t tasks = (chunks + kChunksPerTask - 1) / kChunksPerTask;
  const auto task = [&](std::int64_t t) {
    const std::int64_t last = std::min(chunks, (t + 1) * kChunksPerTask);
    for (std::int64_t c = t * kChunksPerTask; c < last; ++c)
      chunk_sumsq[c] =
          reduce_chunk(sum, others, c * kSumsqChunk, std::min(n, (c + 1) * kSumsqChunk));
  };
  if (pool && tasks > 1) {
    pool->run(tasks, task);
  } else {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  }
  // sum_of_squares adds the chunk sums from 0.0 in chunk order; so does this.
  double s = 0.0;
  for (double c : chunk_sumsq) s += c;
  return s;
}

namespace {

// Copies chunks [first, last) of a raw push into dest, returns the CRC of their bytes and,
// with `chunk_sumsq`, writes each chunk's sum of squares.
PDTRAIN_UPDATE_CLONES std::uint32_t ingest_chunks(const char* wire, float* dest, std::int64_t n,
                                                  std::int64_t first, std::int64_t last,
                                                  double* chunk_sumsq) {
  const std::int64_t begin = first * kSumsqChunk, end = std::min(n, last * kSumsqChunk);
  const auto bytes = static_cast<std::size_t>(end - begin) * sizeof(float);
  std::memcpy(dest + begin, wire + begin * sizeof(float), bytes);
  const std::uint32_t crc = crc32c(dest + begin, bytes);  // the copy is in cache
  if (chunk_sumsq) {
    const auto at = [dest](std::int64_t i) { return dest[i]; };
    for (std::int64_t c = first; c < last; ++c)
      chunk_sumsq[c] =
          sumsq_chunk(at, c * kSumsqChunk, std::min(n, (c + 1) * kSumsqChunk) - c * kSumsqChunk);
  }
  return crc;
}

}  // namespace

std::uint32_t ingest_raw_gradient(WorkerPool* pool, const char* wire, float* dest, std::int64_t n,
                                  double* sumsq) {
  const std::int64_t chunks = std::max<std::int64_t>(1, (n + kSumsqChunk - 1) / kSumsqChunk);
  const std::int64_t tasks = (chunks + kChunksPerTask - 1) / kChunksPerTask;
  std::vector<double> chunk_sumsq(sumsq ? static_cast<std::size_t>(chunks) : 0);
  std::vector<std::uint32_t> task_crc(static_cast<std::size_t>(tasks));
  const auto task = [&](std::int64_t t) {
    task_crc[t] =
        ingest_chunks(wire, dest, n, t * kChunksPerTask, std::min(chunks, (t + 1) * kChunksPerTask),
                      sumsq ? chunk_sumsq.data() : nullptr);
  };
  if (pool && tasks > 1) {
    pool->run(tasks, task);
  } else {
    for (std::int64_t t = 0; t < tasks; ++t) task(t);
  }
  std::uint32_t crc = task_crc[0];
  for (std::int64_t t = 1; t < tasks; ++t) {
    const std::int64_t len =
        std::min(n, (t + 1) * kChunksPerTask * kSumsqChunk) - t * kChunksPerTask * kSumsqChunk;
    crc = crc32c_combine(crc, task_crc[t], static_cast<std::size_t>(len) * sizeof(float));
  }
  if (sumsq) {
    double s = 0.0;  // sum_of_squares' order: chunk sums from 0.0, in chunk order
    for (double c : chunk_sumsq) s += c;
    *sumsq = s;
  }
  return crc;
}

// --- The fused update ----------------------------------------------------------------------------

namespace {

// AdamW over a slice, and the slice's wire form written in the same loop while each value is
// in a register. `k` is copied so that the compiler knows the stores cannot change it.
PDTRAIN_UPDATE_CLONES void adamw_slice(const AdamWStep& step, const float* __restrict g,
                                       float* __restrict p, float* __restrict m,
                                       float* __restrict v, std::int64_t n) {
  const AdamWStep k = step;
  for (std::int64_t i = 0; i < n; ++i) adamw_element(k, g[i], p[i], m[i], v[i]);
}

PDTRAIN_UPDATE_CLONES void adamw_slice_raw(const AdamWStep& step, const float* __restrict g,
                                           float* __restrict p, float* __restrict m,
                                           float* __restrict v, float* __restrict out,
                                           std::int64_t n) {
  const AdamWStep k = step;
  for (std::int64_t i = 0; i < n; ++i) {
    adamw_element(k, g[i], p[i], m[i], v[i]);
    out[i] = p[i];
  }
}

PDTRAIN_UPDATE_CLONES void adamw_slice_bf16(const AdamWStep& step, const float* __restrict g,
                                            float* __restrict p, float* __restrict m,
                                            float* __restrict v, std::uint16_t* __restrict out,
                                            std::int64_t n) {
  const AdamWStep k = step;
  for (std::int64_t i = 0; i < n; ++i) {
    adamw_element(k, g[i], p[i], m[i], v[i]);
    out[i] = to_bf16(p[i]).bits;
  }
}

// With a prediction (bounded staleness): the version served, extrapolated from the update just
// made while it is in registers: p + lead (p - p_before) + trend u_change, where u_change is
// the part of the update that the momentum's change this step made (pd/staleness.hpp).
inline float predicted_element(const AdamWStep& k, const Prediction& f, float g, float& p,
                               float& m, float& v) {
  const float p_before = p, m_before = m;
  adamw_element(k, g, p, m, v);
  const float v_hat = v / k.bias_correction2;
  const float m_change_hat = (m - m_before) / k.bias_correction1;
  const float u_change = -k.lr * (m_change_hat / (sqrtf(v_hat) + k.eps));
  return p + f.lead * (p - p_before) + f.trend * u_change;
}

PDTRAIN_UPDATE_CLONES void adamw_slice_predicted(const AdamWStep& step, const float* __restrict g,
                                                 float* __restrict p, float* __restrict m,
                                                 float* __restrict v, float* __restrict out,
                                                 Prediction f, std::int64_t n) {
  const AdamWStep k = step;
  for (std::int64_t i = 0; i < n; ++i) out[i] = predicted_element(k, f, g[i], p[i], m[i], v[i]);
}

PDTRAIN_UPDATE_CLONES void adamw_slice_predicted_bf16(const AdamWStep& step,
                                                      const float* __restrict g,
                                                      float* __restrict p, float* __restrict m,
                                                      float* __restrict v,
                                                      std::uint16_t* __restrict out, Prediction f,
                                                      std::int64_t n) {
  const AdamWStep k = step;
  for (std::int64_t i = 0; i < n; ++i)
    out[i] = to_bf16(predicted_element(k, f, g[i], p[i], m[i], v[i])).bits;
}

}  // namespace

int fused_wire_bytes(WireCodec codec) {
  switch (codec) {
    case WireCodec::raw: return 4;
    case WireCodec::bf16: return 2;
    default: return 0;
  }
}

FusedUpdate::FusedUpdate(WireCodec codec, std::vector<Block> blocks, std::int64_t slice_floats)
    : codec_(codec), blocks_(std::move(blocks)), slice_(slice_floats),
      state_(std::make_unique<Progress[]>(blocks_.size())) {
  PDT_CHECK(slice_ > 0, "the update's slice must hold at least one element");
  const int wire_bytes = fused_wire_bytes(codec_);
  for (std::size_t b = 0; b < blocks_.size(); ++b) {
    Block& blk = blocks_[b];
    PDT_CHECK(blk.encoded || blk.wire_at || codec_ == WireCodec::raw,
              "only the raw codec can serve a block's parameters in place");
    PDT_CHECK(!blk.wire_at || wire_bytes > 0, "only fixed-width codecs have a fixed place");
    const auto n = static_cast<std::int64_t>(blk.state->param.size());
    // Workers write disjoint slices of the wire bytes: size them before any starts.
    if (blk.encoded && !blk.wire_at && wire_bytes > 0)
      blk.encoded->resize(static_cast<std::size_t>(n * wire_bytes));
    PDT_CHECK(blk.predict.exact() || ((blk.encoded || blk.wire_at) && (wire_bytes > 0 || blk.predicted)),
              "a predicted version needs a copy to be served from");
    if (!blk.predict.exact() && wire_bytes == 0) blk.predicted->resize(static_cast<std::size_t>(n));
    const std::int64_t slices = std::max<std::int64_t>(1, (n + slice_ - 1) / slice_);
    state_[b].slices_left.store(slices, std::memory_order_relaxed);
    state_[b].slice_crc.assign(static_cast<std::size_t>(slices), 0u);
    for (std::int64_t s = 0; s < slices; ++s) tasks_.emplace_back(b, s * slice_);
  }
}

void FusedUpdate::start(WorkerPool& pool) {
  pool.start(static_cast<std::int64_t>(tasks_.size()), [this](std::int64_t t) { run_slice(t); });
}

void FusedUpdate::run_here() {
  for (std::size_t t = 0; t < tasks_.size(); ++t) run_slice(static_cast<std::int64_t>(t));
}

bool FusedUpdate::run_next_here() {
  if (next_here_ >= tasks_.size()) return false;
  run_slice(static_cast<std::int64_t>(next_here_++));
  return true;
}

// One slice: AdamW, the wire form (raw, bf16) and its CRC while the slice is in cache. The
// worker finishing a block's last slice completes the block.
void FusedUpdate::run_slice(std::int64_t task) {
  const auto [b, begin] = tasks_[static_cast<std::size_t>(task)];
  Block& blk = blocks_[b];
  BlockState& s = *blk.state;
  const std::int64_t n = std::min(slice_, static_cast<std::int64_t>(s.param.size()) - begin);
  const float* g = blk.grad + begin;
  float* p = s.param.data() + begin;
  float* m = s.m.data() + begin;
  float* v = s.v.data() + begin;
  const int wire_bytes = fused_wire_bytes(codec_);
  const void* wire = nullptr;
  if (!blk.predict.exact()) {
    wire = run_predicted_slice(blk, begin, n);
  } else if (codec_ == WireCodec::bf16) {
    auto* out = reinterpret_cast<std::uint16_t*>(wire_copy(blk)) + begin;
    adamw_slice_bf16(blk.step, g, p, m, v, out, n);
    wire = out;
  } else if (codec_ == WireCodec::raw && (blk.encoded || blk.wire_at)) {
    auto* out = reinterpret_cast<float*>(wire_copy(blk)) + begin;
    adamw_slice_raw(blk.step, g, p, m, v, out, n);
    wire = out;
  } else {
    adamw_slice(blk.step, g, p, m, v, n);
    wire = p;  // raw served in place; for lz4 unused
  }
  if (wire_bytes > 0)
    state_[b].slice_crc[static_cast<std::size_t>(begin / slice_)] =
        crc32c(wire, static_cast<std::size_t>(n * wire_bytes));
  if (state_[b].slices_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_block(b);
}

// A slice whose version is served extrapolated: into the wire bytes (raw, bf16), or for lz4
// into the block's float copy that finish_block compresses. Returns the wire bytes, or null.
const void* FusedUpdate::run_predicted_slice(Block& blk, std::int64_t begin, std::int64_t n) {
  BlockState& s = *blk.state;
  const float* g = blk.grad + begin;
  float* p = s.param.data() + begin;
  float* m = s.m.data() + begin;
  float* v = s.v.data() + begin;
  if (codec_ == WireCodec::bf16) {
    auto* out = reinterpret_cast<std::uint16_t*>(wire_copy(blk)) + begin;
    adamw_slice_predicted_bf16(blk.step, g, p, m, v, out, blk.predict, n);
    return out;
  }
  float* out = codec_ == WireCodec::raw ? reinterpret_cast<float*>(wire_copy(blk)) + begin
                                        : blk.predicted->data() + begin;
  adamw_slice_predicted(blk.step, g, p, m, v, out, blk.predict, n);
  return codec_ == WireCodec::raw ? out : nullptr;
}

char* FusedUpdate::wire_copy(const Block& blk) {
  if (blk.wire_at) return blk.wire_at;
  return blk.encoded ? blk.encoded->data() : nullptr;
}

// The block's CRC from its slices' (raw, bf16), or its encoding in one piece (lz4 compresses a
// whole block); then the block is published to whoever waits.
void FusedUpdate::finish_block(std::size_t b) {
  Block& blk = blocks_[b];
  const BlockState& s = *blk.state;
  const auto n = static_cast<std::int64_t>(s.param.size());
  const int wire_bytes = fused_wire_bytes(codec_);
  if (wire_bytes > 0) {
    const std::vector<std::uint32_t>& crcs = state_[b].slice_crc;
    std::uint32_t crc = crcs[0];
    for (std::size_t i = 1; i < crcs.size(); ++i) {
      const std::int64_t len = std::min(slice_, n - static_cast<std::int64_t>(i) * slice_);
      crc = crc32c_combine(crc, crcs[i], static_cast<std::size_t>(len * wire_bytes));
    }
    blk.crc = crc;
  } else {
    blk.encoded->clear();
    wire_encode(codec_, !blk.predict.exact() ? blk.predicted->data() : s.param.data(), n,
                *blk.encoded);
    blk.crc = crc32c(blk.encoded->data(), blk.encoded->size());
  }
  state_[b].done.store(true, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++completed_;
  }
  progress_.notify_all();
}

std::int64_t FusedUpdate::completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

void FusedUpdate::wait_for_progress(std::int64_t seen, std::chrono::microseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait_for(lock, timeout, [&] { return completed_ > seen; });
}

}  // namespace pdtrain
