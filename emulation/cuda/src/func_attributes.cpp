// Kernel attributes (cudaFuncSetAttribute): the dynamic shared memory a kernel may ask for at a
// launch. CUDA: "Kernels relying on shared memory allocations over 48 KB per block are
// architecture-specific, and must use dynamic shared memory and require an explicit opt-in
// using cudaFuncSetAttribute()" (CUDA C++ Programming Guide, Shared Memory, compute
// capability 9.0: up to 227 KB per block). The launch check (kernels.cpp) asks
// dynamic_shared_limit() for the kernel's limit.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <string>

#include "emulator.hpp"

namespace cuda_emu {
namespace {

std::mutex g_mu;
std::map<const void*, std::size_t>* g_limits = new std::map<const void*, std::size_t>;

}  // namespace

std::size_t dynamic_shared_limit(const void* func) {
  std::lock_guard lock(g_mu);
  const auto it = g_limits->find(func);
  return it == g_limits->end() ? kDefaultDynamicShared : it->second;
}

}  // namespace cuda_emu

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  using namespace cuda_emu;
  if (func == nullptr) return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute", "no kernel");
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
                "attribute " + std::to_string(static_cast<int>(attr)) +
                    " (the emulation has cudaFuncAttributeMaxDynamicSharedMemorySize only)");
  if (value < 0 || static_cast<std::size_t>(value) > kMaxOptinShared)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute",
                "cudaFuncAttributeMaxDynamicSharedMemorySize " + std::to_string(value) +
                    " (sm_90 allows at most " + std::to_string(kMaxOptinShared) + " bytes)");
  std::lock_guard lock(g_mu);
  (*g_limits)[func] = static_cast<std::size_t>(value);
  return cudaSuccess;
}
