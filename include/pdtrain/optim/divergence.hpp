#pragma once
// The divergence guard's arithmetic: a step whose loss or gradient norm is not finite is never
// applied (an AdamW step with a NaN clip factor turns every parameter into NaN), and the run
// ends with exit status 5 naming the step, the quantity and where it was seen. Used alike by the
// holders (the agreed norm), the replicated baseline (its own norm) and the compute ranks (the
// loss).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pdtrain {

// The first index of `values` that is not finite, or -1.
int first_non_finite(const std::vector<double>& values);

// The median of `values` (non-empty; the mean of the middle two for an even count).
double median(std::vector<double> values);

// "training diverged at step S: <quantity> is <value> (<where>)": the one wording of every
// divergence report, whichever rank saw it (callers add what was and was not applied).
std::string divergence_message(std::int64_t step, const std::string& quantity, double value,
                               const std::string& where);

// The report of a gradient norm that is not finite at `step`, from the per-block sums of squares
// it came from: the first block whose gradient is not finite, as `block_where(b)` names it.
std::string norm_divergence_message(std::int64_t step, double norm,
                                    const std::vector<double>& block_sumsq,
                                    const std::function<std::string(int block)>& block_where);

}  // namespace pdtrain
