// The oneDNN GEMM backend: one matmul primitive per shape, created at first use and reused
// (the model calls the same few shapes every step), on one CPU engine and stream per process.
// Row-major operands and transposes are plain strided memory descriptors: nothing is copied.
// Not thread-safe (the cache is unlocked): see gemm.hpp.
#ifdef PDTRAIN_GEMM_ONEDNN

#include <bit>
#include <compare>
#include <cstdint>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "gemm_backend.hpp"

#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

// OpenBLAS's thread count, the one knob pdtrain sets (weak: null with another BLAS).
extern "C" __attribute__((weak)) int openblas_get_num_threads(void);

namespace pdtrain::kernels::detail {

namespace {

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// ---------------------------------------------------------------------------------------------
// The oneDNN 2.x / 3.x differences, in one place.
// alpha: 2.x multiplies the result by an output scale fixed at creation; 3.x has no output
//   scales and takes a source scale (alpha * A) as a runtime argument.
// beta: a sum post-op (dst = result + beta * dst) in both.
// primitive_desc: 2.x from an operation descriptor, 3.x directly from the memory descriptors.

void set_alpha(dnnl::primitive_attr& attr, float alpha) {
#if DNNL_VERSION_MAJOR >= 3
  (void)alpha;
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
#else
  attr.set_output_scales(0, {alpha});
#endif
}

// The runtime argument that carries alpha (3.x only), read from *alpha at each execution.
void add_alpha_arg([[maybe_unused]] std::unordered_map<int, dnnl::memory>& args,
                   [[maybe_unused]] const dnnl::engine& engine, [[maybe_unused]] float* alpha) {
#if DNNL_VERSION_MAJOR >= 3
  const dnnl::memory::desc md({1}, dt::f32, dnnl::memory::format_tag::x);
  args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, dnnl::memory(md, engine, alpha));
#endif
}

// An empty primitive_desc when oneDNN has no implementation (not an exception).
dnnl::matmul::primitive_desc make_pd(const dnnl::engine& engine, const dnnl::memory::desc& a,
                                     const dnnl::memory::desc& b, const dnnl::memory::desc& c,
                                     const dnnl::primitive_attr& attr) {
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(engine, a, b, c, attr, /*allow_empty=*/true);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine,
                                      /*allow_empty=*/true);
#endif
}

// ---------------------------------------------------------------------------------------------
// Threads. With the OpenMP runtime oneDNN uses omp_get_max_threads() threads, by default all
// cores; pdtrain's thread knob is the BLAS thread count (one per rank under mpirun-local), so
// each call runs with that many, restoring the caller's OpenMP setting afterwards. Other
// runtimes (TBB, sequential) keep their own defaults.

int gemm_threads() {
  if (openblas_get_num_threads != nullptr) return openblas_get_num_threads();
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
  return omp_get_max_threads();
#else
  return 0;
#endif
}

class ThreadScope {
 public:
  explicit ThreadScope([[maybe_unused]] int n) {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    prev_ = omp_get_max_threads();
    if (n > 0 && n != prev_) omp_set_num_threads(n);
#endif
  }
  ~ThreadScope() {
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP
    if (omp_get_max_threads() != prev_) omp_set_num_threads(prev_);
#endif
  }
  ThreadScope(const ThreadScope&) = delete;
  ThreadScope& operator=(const ThreadScope&) = delete;

 private:
  [[maybe_unused]] int prev_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The primitive cache. alpha and beta are part of the key because oneDNN 2.x fixes both at
// creation (output scale, sum post-op scale); the thread count because oneDNN may partition
// the work for it at creation.

struct Key {
  bool bf16;
  bool trans_a, trans_b;
  int M, N, K, lda, ldb, ldc;
  std::uint32_t alpha_bits, beta_bits;
  int threads;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  dnnl::matmul prim;                           // empty when `converted`
  std::unordered_map<int, dnnl::memory> args;  // data handles set at each call
  std::string impl;                            // oneDNN's implementation name
  bool converted = false;  // bf16 without a native kernel: the caller widens to fp32
  float alpha = 1;         // 3.x reads alpha from here at execution
};

struct Context {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Entry> cache;  // node-based: Entry addresses (alpha) stay valid
};

Context& context() {
  static Context c;
  return c;
}

std::string describe(const Key& k) {
  return std::string(k.bf16 ? "bf16 " : "f32 ") + (k.trans_a ? 'T' : 'N') +
         (k.trans_b ? 'T' : 'N') + " M=" + std::to_string(k.M) + " N=" + std::to_string(k.N) +
         " K=" + std::to_string(k.K) + " lda=" + std::to_string(k.lda) +
         " ldb=" + std::to_string(k.ldb) + " ldc=" + std::to_string(k.ldc);
}

[[noreturn]] void fail(const Key& k, const char* what, dnnl_status_t status) {
  throw std::runtime_error(std::string("pdtrain::gemm (oneDNN): ") + what + " (status " +
                           dnnl_status2str(status) + ") for " + describe(k));
}

// Logical rows x cols, stored row-major with row stride ld, or transposed (stored cols x rows).
dnnl::memory::desc matrix_md(dt type, int rows, int cols, int ld, bool trans) {
  return dnnl::memory::desc({rows, cols}, type, trans ? dims{1, ld} : dims{ld, 1});
}

void build(Entry& e, const Key& k) {
  Context& c = context();
  const dt in = k.bf16 ? dt::bf16 : dt::f32;
  const auto a = matrix_md(in, k.M, k.K, k.lda, k.trans_a);
  const auto b = matrix_md(in, k.K, k.N, k.ldb, k.trans_b);
  const auto d = matrix_md(dt::f32, k.M, k.N, k.ldc, false);
  e.alpha = std::bit_cast<float>(k.alpha_bits);
  const float beta = std::bit_cast<float>(k.beta_bits);

  // alpha = 1 and beta = 0 without attributes: the plainest problem gets the fastest kernels.
  dnnl::primitive_attr attr;
  if (e.alpha != 1.0f) set_alpha(attr, e.alpha);
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  const ThreadScope threads(k.threads);
  const auto pd = make_pd(c.engine, a, b, d, attr);
  // bf16 on a CPU without AVX-512 either has no implementation or only the reference one
  // (a naive loop, ~100x slower than widening to fp32): decide here, once per shape.
  if (!pd || std::string(pd.impl_info_str()).rfind("ref", 0) == 0) {
    if (k.bf16) {
      e.converted = true;
      e.impl = pd ? pd.impl_info_str() : "none";
      return;
    }
    if (!pd) fail(k, "no matmul implementation", dnnl_unimplemented);
  }
  e.impl = pd.impl_info_str();
  e.prim = dnnl::matmul(pd);
  e.args.emplace(DNNL_ARG_SRC, dnnl::memory(a, c.engine, DNNL_MEMORY_NONE));
  e.args.emplace(DNNL_ARG_WEIGHTS, dnnl::memory(b, c.engine, DNNL_MEMORY_NONE));
  e.args.emplace(DNNL_ARG_DST, dnnl::memory(d, c.engine, DNNL_MEMORY_NONE));
  if (e.alpha != 1.0f) add_alpha_arg(e.args, c.engine, &e.alpha);
}

Entry& entry(const Key& k) {
  auto& cache = context().cache;
  auto [it, fresh] = cache.try_emplace(k);
  if (fresh) {
    try {
      build(it->second, k);
    } catch (const dnnl::error& err) {
      cache.erase(it);
      fail(k, err.what(), err.status);
    } catch (...) {
      cache.erase(it);
      throw;
    }
  }
  return it->second;
}

Key make_key(bool bf16, bool ta, bool tb, int M, int N, int K, float alpha, int lda, int ldb,
             float beta, int ldc) {
  return Key{bf16,
             ta,
             tb,
             M,
             N,
             K,
             lda,
             ldb,
             ldc,
             std::bit_cast<std::uint32_t>(alpha),
             std::bit_cast<std::uint32_t>(beta),
             gemm_threads()};
}

void execute(Entry& e, const Key& k, const void* A, const void* B, float* C) {
  try {
    e.args.at(DNNL_ARG_SRC).set_data_handle(const_cast<void*>(A));
    e.args.at(DNNL_ARG_WEIGHTS).set_data_handle(const_cast<void*>(B));
    e.args.at(DNNL_ARG_DST).set_data_handle(C);
    const ThreadScope threads(k.threads);
    e.prim.execute(context().stream, e.args);
    context().stream.wait();
  } catch (const dnnl::error& err) {
    fail(k, err.what(), err.status);
  }
}

// The shape gemm_bf16_native() and the description probe.
constexpr int kProbe = 256;

}  // namespace

void onednn_gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  const Key k = make_key(false, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc);
  execute(entry(k), k, A, B, C);
}

bool onednn_gemm_bf16(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const bf16* A,
                      int lda, const bf16* B, int ldb, float beta, float* C, int ldc) {
  const Key k = make_key(true, trans_a, trans_b, M, N, K, alpha, lda, ldb, beta, ldc);
  Entry& e = entry(k);
  if (e.converted) return false;
  execute(e, k, A, B, C);
  return true;
}

bool onednn_bf16_native() {
  static const bool native =
      !entry(make_key(true, false, false, kProbe, kProbe, kProbe, 1, kProbe, kProbe, 0, kProbe))
           .converted;
  return native;
}

std::string onednn_description() {
  const auto* v = dnnl::version();
  const Key f32 =
      make_key(false, false, false, kProbe, kProbe, kProbe, 1, kProbe, kProbe, 0, kProbe);
  Key bf = f32;
  bf.bf16 = true;
  const Entry& eb = entry(bf);
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (fp32: " + entry(f32).impl + ", bf16: " +
         (eb.converted ? "converted to fp32, no native kernel (" + eb.impl + ")" : eb.impl) +
         "; fp64: CBLAS)";
}

}  // namespace pdtrain::kernels::detail

#endif  // PDTRAIN_GEMM_ONEDNN
