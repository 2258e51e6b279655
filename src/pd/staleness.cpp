#include "pdtrain/pd/staleness.hpp"

#include <algorithm>

namespace pdtrain {

std::int64_t StalenessPlan::version_for_step(std::int64_t step, std::int64_t start) const {
  const std::int64_t delay = step <= warmup ? 0 : staleness;
  return std::max(start, step - 1 - delay);
}

bool StalenessPlan::evaluated_after(std::int64_t step) const {
  return step == last_step || (eval_every > 0 && step % eval_every == 0);
}

// Versions below `warmup` are computed on synchronously; a version that is evaluated must be
// the holders' parameters. Every other version is only ever used by a step s updates behind.
float StalenessPlan::prediction_updates(std::int64_t version) const {
  if (!predict || staleness == 0 || version < warmup || evaluated_after(version)) return 0.0f;
  return static_cast<float>(staleness) + kPredictionLead;
}

}  // namespace pdtrain
