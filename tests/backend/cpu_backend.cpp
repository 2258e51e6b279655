// The backend tests on the CPU backend (always built, always run).
#include "backends.hpp"

namespace pdtrain {

INSTANTIATE_TEST_SUITE_P(Cpu, BackendTest,
                         ::testing::Values(BackendFactory{"cpu", &kernels::make_cpu_backend}),
                         backend_name);

}  // namespace pdtrain
