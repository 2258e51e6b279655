#pragma once
// What the host is, for benchmarks and calibrations to say which machine they measured.
#include <string>

namespace pdtrain {

// The CPU's model name as /proc/cpuinfo gives it ("unknown" where it does not).
std::string cpu_model_name();

}  // namespace pdtrain
