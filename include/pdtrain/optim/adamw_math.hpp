#pragma once
// The optimizer's arithmetic, once, for every place that runs it: holders and the replicated
// baseline on CPUs (optim/adamw.cpp) and the GPU baseline (CUDA). Header-only and usable in
// device code; compiled without FMA contraction everywhere (-ffp-contract=off on the host,
// --fmad=false for the CUDA optimizer), so a parameter updates to the same bits on a CPU and a
// GPU.
#include <cmath>
#include <cstdint>

#include "pdtrain/core/bf16.hpp"  // PDTRAIN_HOST_DEVICE

namespace pdtrain {

// The per-step constants of one AdamW update, computed once on the host in float.
struct AdamWStep {
  float beta1 = 0.9f, beta2 = 0.95f;
  float bias_correction1 = 1.0f, bias_correction2 = 1.0f;  // 1 - beta^step
  float lr = 0.0f, eps = 1e-8f;
  float weight_decay = 0.0f;  // 0 for blocks without decay
  float grad_scale = 1.0f;    // the clip factor
};

// One element: m, v and the parameter updated in place from gradient g.
PDTRAIN_HOST_DEVICE inline void adamw_element(const AdamWStep& s, float g, float& param,
                                              float& m, float& v) {
  const float grad = g * s.grad_scale;
  const float m1 = s.beta1 * m + (1.0f - s.beta1) * grad;
  const float v1 = s.beta2 * v + (1.0f - s.beta2) * grad * grad;
  m = m1;
  v = v1;
  const float m_hat = m1 / s.bias_correction1, v_hat = v1 / s.bias_correction2;
  param -= s.lr * (m_hat / (sqrtf(v_hat) + s.eps) + s.weight_decay * param);
}

// Sum of squares of a gradient block in a fixed order that both a CPU core and a GPU compute
// quickly: the block's elements, in packed (row-major) order, are cut into chunks of
// kSumsqChunk; a chunk is summed in kSumsqLanes interleaved partial sums (lane j takes
// elements j, j + 8, ...) combined in a fixed tree; the chunk sums are added in order. All in
// double. `at(i)` yields element i of the block.
constexpr std::int64_t kSumsqChunk = 4096;
constexpr int kSumsqLanes = 8;

template <class At>
PDTRAIN_HOST_DEVICE inline double sumsq_chunk(const At& at, std::int64_t begin, std::int64_t n) {
  double lane[kSumsqLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + kSumsqLanes <= n; i += kSumsqLanes)
    for (int j = 0; j < kSumsqLanes; ++j) {
      const double x = at(begin + i + j);
      lane[j] += x * x;
    }
  for (int j = 0; i + j < n; ++j) {
    const double x = at(begin + i + j);
    lane[j] += x * x;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

}  // namespace pdtrain
