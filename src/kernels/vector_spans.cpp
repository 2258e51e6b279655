// The float span kernels of gpt_kernels.hpp (exp_shifted, gelu_span, gelu_grad_span) as
// explicit SIMD: 4 lanes with the baseline ISA and, on x86-64, 8 lanes compiled for AVX2 and
// chosen at run time when the CPU has it. The build uses no -march flags, so without this the
// exp-heavy loops would run scalar. Both widths and the scalar functions agree bit for bit:
// the same IEEE operations per element. GCC contracts a*b+c into an FMA whenever FMA
// instructions are enabled (-march=native on a cluster); the build passes -ffp-contract=off
// (tests/core/test_fp_contract.cpp fails a build without it), so every width rounds the same.
#include "pdtrain/kernels/gpt_kernels.hpp"

#ifdef PDTRAIN_KERNELS_VECTOR_SPANS

#include <atomic>
#include <cstring>
#include <limits>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wpsabi"  // 32-byte vectors in the AVX2 part are internal
#endif

namespace pdtrain::kernels::detail {

namespace lanes4 {
using VF = float __attribute__((vector_size(16)));
using VI = std::int32_t __attribute__((vector_size(16)));
constexpr int W = 4;
#include "vector_spans.inc"
}  // namespace lanes4

#if defined(__x86_64__) || defined(__i386__)
#define PDTRAIN_HAVE_AVX2_SPANS 1
#pragma GCC push_options
#pragma GCC target("avx2")
namespace lanes8 {
using VF = float __attribute__((vector_size(32)));
using VI = std::int32_t __attribute__((vector_size(32)));
constexpr int W = 8;
#include "vector_spans.inc"
}  // namespace lanes8
#pragma GCC pop_options
#endif

namespace {

bool cpu_has_avx2() {
#ifdef PDTRAIN_HAVE_AVX2_SPANS
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") != 0;
#else
  return false;
#endif
}

std::atomic<int>& lanes_in_use() {
  static std::atomic<int> lanes{cpu_has_avx2() ? 8 : 4};
  return lanes;
}

bool use8() { return lanes_in_use().load(std::memory_order_relaxed) == 8; }

}  // namespace

int vector_lanes() { return lanes_in_use().load(); }

int set_vector_lanes(int lanes) {
  lanes_in_use().store(lanes == 4 || !cpu_has_avx2() ? 4 : 8);
  return vector_lanes();
}

#ifdef PDTRAIN_HAVE_AVX2_SPANS
#define PDTRAIN_DISPATCH(call) (use8() ? lanes8::call : lanes4::call)
#else
#define PDTRAIN_DISPATCH(call) lanes4::call
#endif

void exp_shifted(float* out, const float* in, float shift, Index n) {
  PDTRAIN_DISPATCH(exp_shifted(out, in, shift, n));
}

void gelu_span(float* out, const float* in, Index n) { PDTRAIN_DISPATCH(gelu_span(out, in, n)); }

void gelu_grad_span(float* dinp, const float* inp, const float* dout, Index n, bool overwrite) {
  PDTRAIN_DISPATCH(gelu_grad_span(dinp, inp, dout, n, overwrite));
}

#undef PDTRAIN_DISPATCH

}  // namespace pdtrain::kernels::detail

#endif  // PDTRAIN_KERNELS_VECTOR_SPANS
