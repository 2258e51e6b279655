#include "pdtrain/optim/divergence.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pdtrain {

int first_non_finite(const std::vector<double>& values) {
  for (std::size_t i = 0; i < values.size(); ++i)
    if (!std::isfinite(values[i])) return static_cast<int>(i);
  return -1;
}

double median(std::vector<double> values) {
  const auto mid = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), mid, values.end());
  if (values.size() % 2 == 1) return *mid;
  return 0.5 * (*std::max_element(values.begin(), mid) + *mid);  // the lower middle is below
}

std::string divergence_message(std::int64_t step, const std::string& quantity, double value,
                               const std::string& where) {
  char v[32];
  std::snprintf(v, sizeof v, "%g", value);
  return "training diverged at step " + std::to_string(step) + ": " + quantity + " is " + v +
         " (" + where + ")";
}

std::string norm_divergence_message(std::int64_t step, double norm,
                                    const std::vector<double>& block_sumsq,
                                    const std::function<std::string(int block)>& block_where) {
  const int b = first_non_finite(block_sumsq);
  return divergence_message(step, "the gradient norm", norm,
                            b < 0 ? "every block's sum of squares is finite, their sum is not"
                                  : "the gradient of block " + block_where(b)) +
         "; neither this update nor any later one was applied, and no checkpoint was written "
         "after step " + std::to_string(step - 1);
}

}  // namespace pdtrain
