// test_backend runs the backend tests (test_kernel_ops.cpp, test_device_backend.cpp) on the CPU
// backend; test_backend_cuda runs the same tests on a GPU (cuda/cuda_test_main.cpp).
#include "backend_test_support.hpp"

namespace pdtrain::kernels::testing {

std::vector<TestBackend> test_backends() { return {{"cpu", [] { return make_backend("cpu"); }}}; }
std::vector<TestBackend> attention_backends() { return {}; }

}  // namespace pdtrain::kernels::testing
