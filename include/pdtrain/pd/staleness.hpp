#pragma once
// Bounded staleness as a schedule both sides of PD follow without talking about it: which
// parameter version each step computes on, and in which form holders serve each version.
//
// - Step k computes on version max(start, k-1-d), d = delay_at(k): 0 (synchronously) while
//   k <= warmup (ZeRO-Offload's warm-up before its delayed parameter update), then s; with a
//   ramp, d grows from 1 to s by one every `ramp` steps (the hand-over in steps: the stable
//   step shrinks with the delay, and a gradual shrink lets the training move to where it is
//   stable before the next).
// - With a correction, a version v that a delayed step computes on is served extrapolated
//   towards the version its gradient will be applied to, s updates later, from the update
//   that made v (`Prediction`; computed in the holder's fused update: no memory, no extra
//   pass, no extra traffic). The gradient is then taken near the version it is applied to,
//   which is what keeps Adam's momentum stable under a delay (docs/architecture.md, "Bounded
//   staleness").
// - Versions served exactly: the start, those of the synchronous warm-up (v < warmup), and the
//   versions evaluated (the loss printed is the model's, the holders' parameters).
#include <cstdint>

namespace pdtrain {

// pd.stale_correction: none serves every version as it is (plain delayed AdamW).
enum class StaleCorrection { none, predict, trend };

// How a version is served: w_v + lead u_v + trend (u_v - u'_v), where u_v = w_v - w_{v-1} is
// the update that made v and u'_v the update the momentum before it would have made (same lr,
// second moment and weight decay), so u_v - u'_v = -lr (m_v - m_{v-1}) / (c1 (sqrt(v_hat) +
// eps)) is the momentum's last change carried through Adam's scaling. `lead` extrapolates the
// newest update, `trend` its change: on a quadratic this is a second-order extrapolation of
// the parameters, w_v + (lead + trend) u_v - trend u_{v-1}.
struct Prediction {
  float lead = 0.0f;
  float trend = 0.0f;
  bool exact() const { return lead == 0.0f && trend == 0.0f; }
};

// The coefficients per delay s. The analysis (perf/staleness_stability.py: the largest stable
// lr x curvature of EMA momentum at beta1 0.9 on a quadratic) says how stable each is; the
// runs chose among them (perf/RESULTS.md, "Bounded staleness"), because the trend term also
// carries the gradient's noise (the momentum's change is mostly noise), so more stability
// than the training needs costs more than it gives:
// - predict: lead s + 1/2, no trend (3.0 at s = 1 against 1.0 plain, 1.25 at s = 2 against
//   0.51, 0.72 at s = 3 against 0.35);
// - trend: s = 1 lead 1, trend 1/2 (4.3; the most stable, lead 1/4 trend 1 at 7.7, ended
//   worse than no trend); s = 2 lead 3/4, trend 9/4 (3.3, the most stable; trend 3/2 at 2.0
//   ended slightly worse); s = 3 lead 5/4, trend 4 (2.0, the most stable; not measured).
//   Tuned to beta1 0.9: at 0.95 the same coefficients are less stable than "predict".
Prediction prediction_coefficients(StaleCorrection correction, int staleness);

struct StalenessPlan {
  int staleness = 0;
  std::int64_t warmup = 0;      // steps 1..warmup compute on the newest version
  std::int64_t ramp = 0;        // steps per unit of delay after the warm-up; 0: s at once
  StaleCorrection correction = StaleCorrection::none;  // how delayed steps' versions are served
  std::int64_t eval_every = 0;  // versions evaluated: every eval_every-th and the last
  std::int64_t last_step = 0;

  // The delay of step `step`: 0 in the warm-up, then rising to `staleness` (never falls, rises
  // by at most one a step, so the version computed on never goes back).
  int delay_at(std::int64_t step) const;
  // The delay of the last step that computes on version `version` (two steps read the same
  // version where the delay rises; the later one's correction is served).
  int delay_reading(std::int64_t version) const;
  // The version step `step` computes on, in a run that started at version `start`.
  std::int64_t version_for_step(std::int64_t step, std::int64_t start) const;
  // Whether the parameters after `step` are evaluated.
  bool evaluated_after(std::int64_t step) const;
  // How version `version` is served; exact() for the start, warm-up and evaluated versions.
  Prediction prediction(std::int64_t version) const;
};

}  // namespace pdtrain
