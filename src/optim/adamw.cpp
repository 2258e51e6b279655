#include "pdtrain/optim/adamw.hpp"

#include <cmath>

namespace pdtrain {

double learning_rate(const AdamWConfig& c, std::int64_t step) {
  if (c.warmup_steps > 0 && step <= c.warmup_steps)
    return c.lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  const std::int64_t span = c.total_steps - c.warmup_steps;
  if (span <= 0) return c.lr;
  const double progress =
      static_cast<double>(step - c.warmup_steps) / static_cast<double>(span);  // (0, 1]
  const double cosine = 0.5 * (1.0 + std::cos(3.141592653589793 * progress));
  return c.min_lr + (c.lr - c.min_lr) * cosine;
}

double sum_of_squares(const float* g, std::int64_t n) {
  const auto at = [g](std::int64_t i) { return g[i]; };
  double s = 0.0;
  for (std::int64_t c = 0; c < n; c += kSumsqChunk)
    s += sumsq_chunk(at, c, c + kSumsqChunk < n ? kSumsqChunk : n - c);
  return s;
}

AdamWStep adamw_step(const AdamWConfig& c, std::int64_t step, double lr, float scale,
                     bool decay) {
  AdamWStep s;
  s.beta1 = static_cast<float>(c.beta1);
  s.beta2 = static_cast<float>(c.beta2);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(step)));
  s.bias_correction2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(step)));
  s.lr = static_cast<float>(lr);
  s.eps = static_cast<float>(c.eps);
  s.weight_decay = decay ? static_cast<float>(c.weight_decay) : 0.0f;
  s.grad_scale = scale;
  return s;
}

double global_norm(const std::vector<double>& block_sumsq) {
  double s = 0.0;
  for (double x : block_sumsq) s += x;
  return std::sqrt(s);
}

double clip_factor(const AdamWConfig& c, double norm) {
  if (c.grad_clip <= 0.0 || norm <= c.grad_clip) return 1.0;
  return c.grad_clip / (norm + 1e-6);
}

void adamw_elements(const AdamWStep& k, const float* g, float* param, float* m, float* v,
                    std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) adamw_element(k, g[i], param[i], m[i], v[i]);
}

void adamw_update(const AdamWConfig& c, std::int64_t step, double lr, float scale, const float* g,
                  BlockState& s) {
  adamw_elements(adamw_step(c, step, lr, scale, s.decay), g, s.param.data(), s.m.data(),
                 s.v.data(), static_cast<std::int64_t>(s.param.size()));
}

}  // namespace pdtrain
