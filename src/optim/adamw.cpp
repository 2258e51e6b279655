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
  double s = 0.0;
  for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(g[i]) * g[i];
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

void adamw_update(const AdamWConfig& c, std::int64_t step, double lr, float scale, const float* g,
                  BlockState& s) {
  const float b1 = static_cast<float>(c.beta1), b2 = static_cast<float>(c.beta2);
  const float bc1 = static_cast<float>(1.0 - std::pow(c.beta1, static_cast<double>(step)));
  const float bc2 = static_cast<float>(1.0 - std::pow(c.beta2, static_cast<double>(step)));
  const float lr_f = static_cast<float>(lr), eps = static_cast<float>(c.eps);
  const float wd = s.decay ? static_cast<float>(c.weight_decay) : 0.0f;
  const std::size_t n = s.param.size();
  for (std::size_t i = 0; i < n; ++i) {
    const float grad = g[i] * scale;
    const float m = b1 * s.m[i] + (1.0f - b1) * grad;
    const float v = b2 * s.v[i] + (1.0f - b2) * grad * grad;
    s.m[i] = m;
    s.v[i] = v;
    const float m_hat = m / bc1, v_hat = v / bc2;
    s.param[i] -= lr_f * (m_hat / (std::sqrt(v_hat) + eps) + wd * s.param[i]);
  }
}

}  // namespace pdtrain
