#pragma once
// Bounded staleness as a schedule both sides of PD follow without talking about it: which
// parameter version each step computes on, and in which form holders serve each version.
//
// - Step k computes on version max(start, k-1-s), or on version k-1 (synchronously) while
//   k <= warmup (ZeRO-Offload's warm-up before its delayed parameter update).
// - With prediction, a version v that a delayed step computes on is served extrapolated past
//   the s updates the gradient will be late: w_v + (s + kPredictionLead) (w_v - w_{v-1}),
//   computed in the holder's fused update from the update that made v (no memory, no extra
//   pass, no extra traffic). The gradient is then taken near the version it is applied to,
//   which is what keeps Adam's momentum stable under a delay (docs/architecture.md, "Bounded
//   staleness").
// - Versions served exactly: the start, those of the synchronous warm-up (v < warmup), and the
//   versions evaluated (the loss printed is the model's, the holders' parameters).
#include <cstdint>

namespace pdtrain {

// Updates a predicted version leads by beyond the delay. For EMA momentum at beta1 0.9 on a
// quadratic, the largest stable step under delay s peaks at about s + 0.5 updates of
// extrapolation (perf/staleness_stability.py: 3.0 at s = 1 against 2.7 at exactly s, 1.25
// against 1.21 at s = 2), and the runs agree (perf/RESULTS.md, "Bounded staleness").
inline constexpr float kPredictionLead = 0.5f;

struct StalenessPlan {
  int staleness = 0;
  std::int64_t warmup = 0;      // steps 1..warmup compute on the newest version
  bool predict = false;         // serve delayed steps' versions extrapolated
  std::int64_t eval_every = 0;  // versions evaluated: every eval_every-th and the last
  std::int64_t last_step = 0;

  // The version step `step` computes on, in a run that started at version `start`.
  std::int64_t version_for_step(std::int64_t step, std::int64_t start) const;
  // Whether the parameters after `step` are evaluated.
  bool evaluated_after(std::int64_t step) const;
  // How many updates version `version` is extrapolated by when served; 0: served exactly.
  float prediction_updates(std::int64_t version) const;
};

}  // namespace pdtrain
