#include "pdtrain/app/parameter_step.hpp"

namespace pdtrain {

void StepPhases::record(double& ms, const char* phase, double t0, double t1, const char* span,
                        const char* category) {
  ms = 1e3 * (t1 - t0);
  timers_.add(phase, t1 - t0);
  if (trace_ && span) trace_->event(span, category, t0, t1);
}

}  // namespace pdtrain
