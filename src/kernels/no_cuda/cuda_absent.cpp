// A build without the CUDA backend (-DPDTRAIN_CUDA=OFF, or no CUDA toolkit): asking for it is a
// clear error, and there is never a GPU to count.
#include "pdtrain/core/error.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels {

bool cuda_backend_built() { return false; }
int cuda_device_count(std::string* why_none) {
  if (why_none != nullptr) *why_none = "this pdtrain was built without the CUDA backend";
  return 0;
}
bool cuda_gpu_shareable(int) { return false; }
std::string cuda_gpu_uuid(int) { return ""; }
std::string backends_built() { return "cpu"; }

ComputeBackend make_cuda_backend(int) {
  throw Error(ExitCode::runtime,
              "this pdtrain was built without the CUDA backend (configure with "
              "-DPDTRAIN_CUDA=ON and the CUDA toolkit to run compute ranks on GPUs)");
}

}  // namespace pdtrain::kernels
