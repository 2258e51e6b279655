// The backend registry: built once, explicitly, from the CPU's registration and the CUDA
// build's (none without CUDA).
#include "pdtrain/kernels/backend_registry.hpp"

#include "pdtrain/core/error.hpp"

namespace pdtrain::kernels {

const std::vector<BackendEntry>& backend_registry() {
  static const std::vector<BackendEntry> registry = [] {
    std::vector<BackendEntry> r;
    register_cpu_backend(r);
    register_cuda_backends(r);
    return r;
  }();
  return registry;
}

const BackendEntry* find_backend(std::string_view name) {
  for (const BackendEntry& e : backend_registry())
    if (e.name == name) return &e;
  return nullptr;
}

std::string backends_built() {
  std::string list;
  for (const BackendEntry& e : backend_registry())
    list += (list.empty() ? "" : ", ") + e.description;
  return list;
}

ComputeBackend make_backend(std::string_view name, int gpu) {
  if (const BackendEntry* e = find_backend(name)) return e->make(gpu);
  throw Error(ExitCode::runtime, "no compute backend \"" + std::string(name) +
                                     "\" in this pdtrain (it has: " + backends_built() + ")");
}

}  // namespace pdtrain::kernels
