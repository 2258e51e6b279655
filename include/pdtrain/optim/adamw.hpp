#pragma once
// AdamW (decoupled weight decay) over a set of blocks, with llm.c's schedule: linear warmup,
// then cosine decay to min_lr at the last step. Used by the holders for the blocks they own,
// and by every rank of the replicated baseline for all blocks: one implementation, so both
// modes update parameters with identical arithmetic.
#include <cstdint>
#include <vector>

#include "pdtrain/optim/adamw_math.hpp"

namespace pdtrain {

struct AdamWConfig {
  double lr = 3e-4, min_lr = 3e-5;
  std::int64_t warmup_steps = 0, total_steps = 1;
  double weight_decay = 0.0, grad_clip = 0.0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

// Learning rate of 1-based step `step`.
double learning_rate(const AdamWConfig& c, std::int64_t step);

// Sum of squares of a gradient block in double, in adamw_math.hpp's fixed chunked order.
double sum_of_squares(const float* g, std::int64_t n);

// Global gradient norm from per-block sums of squares listed in block order (so the result
// does not depend on how blocks are spread over ranks), and the clip factor it implies.
double global_norm(const std::vector<double>& block_sumsq);
double clip_factor(const AdamWConfig& c, double norm);

// The state of one block: parameters, first and second moments.
struct BlockState {
  std::vector<float> param, m, v;
  bool decay = false;
};

// The float constants of step `step` (1-based) at learning rate `lr` with clip factor `scale`.
AdamWStep adamw_step(const AdamWConfig& c, std::int64_t step, double lr, float scale, bool decay);

// adamw_element over n contiguous elements (vectorized).
void adamw_elements(const AdamWStep& k, const float* g, float* param, float* m, float* v,
                    std::int64_t n);

// One AdamW update of `s` with gradient `g` (already summed over replicas) scaled by `scale`
// (the clip factor); `step` is 1-based.
void adamw_update(const AdamWConfig& c, std::int64_t step, double lr, float scale, const float* g,
                  BlockState& s);

}  // namespace pdtrain
