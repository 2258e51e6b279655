// A build without the CUDA backend (-DPDTRAIN_CUDA=OFF, or no CUDA toolkit): the registry has no
// "cuda" entry (asking for it is a clear error, compute_device.cpp), and there is never a GPU to
// count.
#include "pdtrain/core/error.hpp"
#include "pdtrain/kernels/backend_registry.hpp"

namespace pdtrain::kernels {

void register_cuda_backends(std::vector<BackendEntry>&) {}

bool cuda_backend_built() { return false; }
int cuda_device_count(std::string* why_none) {
  if (why_none != nullptr) *why_none = "this pdtrain was built without the CUDA backend";
  return 0;
}
bool cuda_gpu_shareable(int) { return false; }
ComputeBackend make_cuda_backend(int, AttentionChoice) {
  throw Error(ExitCode::runtime, "this pdtrain was built without the CUDA backend");
}
std::string cuda_gpu_uuid(int) { return ""; }

}  // namespace pdtrain::kernels
