#include "pdtrain/pd/staleness.hpp"

#include <algorithm>

namespace pdtrain {

Prediction prediction_coefficients(StaleCorrection correction, int staleness) {
  if (staleness == 0) return {};
  switch (correction) {
    case StaleCorrection::none: return {};
    case StaleCorrection::predict: return {static_cast<float>(staleness) + 0.5f, 0.0f};
    case StaleCorrection::trend: {
      // pd/staleness.hpp says where these come from.
      static constexpr Prediction kTrend[] = {{1.0f, 0.5f}, {0.75f, 2.25f}, {1.25f, 4.0f}};
      return kTrend[std::min(staleness, 3) - 1];
    }
  }
  return {};
}

int StalenessPlan::delay_at(std::int64_t step) const {
  if (step <= warmup) return 0;
  if (ramp <= 0) return staleness;
  return static_cast<int>(std::min<std::int64_t>(staleness, 1 + (step - warmup - 1) / ramp));
}

int StalenessPlan::delay_reading(std::int64_t version) const {
  for (int d = staleness; d > 0; --d)
    if (delay_at(version + 1 + d) == d) return d;
  return 0;
}

std::int64_t StalenessPlan::version_for_step(std::int64_t step, std::int64_t start) const {
  return std::max(start, step - 1 - delay_at(step));
}

bool StalenessPlan::evaluated_after(std::int64_t step) const {
  return step == last_step || (eval_every > 0 && step % eval_every == 0);
}

// Versions below `warmup` are computed on synchronously; a version that is evaluated must be
// the holders' parameters. Every other version is only ever read by delayed steps, and served
// for the last of them (on the ramp two steps with different delays can read it).
Prediction StalenessPlan::prediction(std::int64_t version) const {
  if (version < warmup || evaluated_after(version)) return {};
  return prediction_coefficients(correction, delay_reading(version));
}

}  // namespace pdtrain
