#pragma once
// The compute backends this binary has, by name: "cpu" always, "cuda" in CUDA builds. Each entry
// is a factory of ComputeBackend (a Device and its KernelOps). The list is built explicitly on
// first use (register_cpu_backend and register_cuda_backends; no static initializers, which a
// static library's linker would drop with the object that holds them).
#include <string>
#include <string_view>
#include <vector>

#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels {

struct BackendEntry {
  std::string name;         // what compute.device says: "cpu", "cuda"
  std::string description;  // for --version: "cpu", "cuda (sm_90)"
  // The backend on GPU `gpu` of this node (ignored by the CPU). Throws pdtrain::Error(runtime)
  // when the device cannot be used.
  ComputeBackend (*make)(int gpu) = nullptr;
};

// Every backend of this binary, "cpu" first.
const std::vector<BackendEntry>& backend_registry();
// The entry called `name`, or null when this binary has none.
const BackendEntry* find_backend(std::string_view name);
// find_backend(name)->make(gpu); an unknown name throws pdtrain::Error(runtime) naming the
// backends this binary has.
ComputeBackend make_backend(std::string_view name, int gpu = 0);

// The attention family of a CUDA backend (the deck's compute.attention): automatic, cuDNN's
// fused attention where it runs and pdtrain's kernel elsewhere; cudnn, the same but a bf16
// run's shape cuDNN refuses is an error; pdtrain, pdtrain's kernel only (the registry's "cuda").
enum class AttentionChoice { automatic, cudnn, pdtrain };
// The CUDA backend on GPU `gpu` of this node with that attention; like the registry's factory,
// throws pdtrain::Error(runtime) when the GPU cannot be used (and in a build without CUDA).
ComputeBackend make_cuda_backend(int gpu, AttentionChoice attention);

// The registrations, called once by backend_registry(): the CPU's (cpu_kernel_ops.cpp) and the
// CUDA build's (src/kernels/cuda/cuda_kernel_ops.cpp; src/kernels/no_cuda adds none).
void register_cpu_backend(std::vector<BackendEntry>& registry);
void register_cuda_backends(std::vector<BackendEntry>& registry);

}  // namespace pdtrain::kernels
