// test_backend_cuda: the backend tests of tests/backend (test_kernel_ops.cpp,
// test_device_backend.cpp) on GPU 0, and the CUDA device's own tests. Without a GPU (no driver,
// no device) it runs nothing and exits 77, which ctest reports as skipped (SKIP_RETURN_CODE).
#include <Kokkos_Core.hpp>
#include <cstdio>

#include "../backend_test_support.hpp"

namespace pdtrain::kernels::testing {

std::vector<TestBackend> test_backends() {
  return {{"cuda", [] { return make_backend("cuda", 0); }}};
}
// cuDNN's attention where it runs the shape (compute.attention = "auto"), pdtrain's elsewhere.
std::vector<TestBackend> attention_backends() {
  return {{"cuda_cudnn", [] { return make_cuda_backend(0, AttentionChoice::automatic); }}};
}

}  // namespace pdtrain::kernels::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (::testing::GTEST_FLAG(list_tests)) return RUN_ALL_TESTS();  // lists, runs nothing
  if (pdtrain::kernels::cuda_device_count() == 0) {
    std::printf(
        "test_backend_cuda: no GPU is visible (no driver or no device): "
        "every CUDA test skipped\n");
    return 77;
  }
  Kokkos::initialize(argc, argv);  // the host reference kernels
  const int rc = RUN_ALL_TESTS();
  Kokkos::finalize();
  return rc;
}
