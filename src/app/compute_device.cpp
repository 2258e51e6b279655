#include "pdtrain/app/compute_device.hpp"

#include "pdtrain/core/error.hpp"
#include "pdtrain/kernels/backend_registry.hpp"

namespace pdtrain {

int node_local_compute_index(const Setup& setup, int rank) {
  int index = 0;
  for (int r = setup.shape.holders; r < rank; ++r)
    if (setup.node[static_cast<std::size_t>(r)] == setup.node[static_cast<std::size_t>(rank)])
      ++index;
  return index;
}

kernels::ComputeBackend make_compute_backend(const Deck& deck, const Setup& setup,
                                             const Layout& layout) {
  if (deck.compute.device == "cpu") return kernels::make_backend("cpu");
  if (!kernels::cuda_backend_built())
    throw Error(ExitCode::deck, deck.where("compute.device") +
                                    ": cuda, but this pdtrain was built without the CUDA backend "
                                    "(configure with -DPDTRAIN_CUDA=ON; pdtrain --version lists "
                                    "the backends built)");
  const int rank = layout.world_rank();
  std::string why_none;
  const int gpus = kernels::cuda_device_count(&why_none);
  if (gpus == 0)
    throw Error(ExitCode::runtime, "rank " + std::to_string(rank) + ": " +
                                       deck.where("compute.device") +
                                       ": cuda, but no GPU is visible to this rank (" + why_none +
                                       "; check the driver, CUDA_VISIBLE_DEVICES and the job's "
                                       "GPU request)");
  try {
    const std::string& a = deck.compute.attention;
    const kernels::AttentionChoice attention = a == "cudnn"     ? kernels::AttentionChoice::cudnn
                                               : a == "pdtrain" ? kernels::AttentionChoice::pdtrain
                                                                : kernels::AttentionChoice::automatic;
    return kernels::make_cuda_backend(node_local_compute_index(setup, rank) % gpus, attention);
  } catch (const Error& e) {
    throw Error(e.code(), "rank " + std::to_string(rank) + ": " + e.what());
  }
}

std::string describe_compute_device(const Deck& deck, const Setup& setup, int rank) {
  if (deck.compute.device == "cpu") return "cpu";
  const int k = node_local_compute_index(setup, rank);
  return "cuda GPU " + std::to_string(k) + " of node " +
         std::to_string(setup.node[static_cast<std::size_t>(rank)]) + " (its compute rank " +
         std::to_string(k) + ", modulo the node's GPUs)";
}

}  // namespace pdtrain
