#pragma once
// How compute ranks talk to each other (parallel.comm): which implementation of the collectives
// seam (core/collectives.hpp) serves the tensor-parallel group, and the groups a compute rank
// builds. NCCL serves a group only when the binary has NCCL, compute.device is the GPU and every
// compute rank has a GPU of its own (ranks sharing a GPU cannot form a NCCL communicator over
// it); otherwise MPI over host memory. The choice is the same for every group: NCCL serves the
// tp all-reduces, the data-parallel gradient reduce (GradReducer) and the pipeline's messages
// (PipelineExecutor) on device memory, or MPI serves them all on host memory (a GPU's data
// staged through pinned memory).
#include <memory>
#include <string>

#include "pdtrain/app/setup.hpp"
#include "pdtrain/core/collectives.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/layout/layout.hpp"

namespace pdtrain {

struct CommChoice {
  bool nccl = false;
  std::string why;  // for the run header: what was asked and why this transport serves it
  double nccl_timeout_s = 0;  // parallel.nccl_timeout_s: NCCL's watchdog (0: off)
};

// Collective over the job (`layout.world()`): on a compute rank whose GPU (`gpu_uuid`, its
// UUID; "" on the CPU and on holders) another compute rank of its node also uses, why NCCL
// cannot serve the node; else "". GPUs are compared by UUID, not counted: with one GPU visible
// per rank (Slurm's GPU binding, CUDA_VISIBLE_DEVICES) every rank sees "GPU 0", yet they differ.
std::string gpu_sharing_on_node(const Setup& setup, const Layout& layout,
                                const std::string& gpu_uuid);

// On a compute rank, no MPI: why NCCL cannot serve this rank ("" when it can), given what
// gpu_sharing_on_node said. Throws pdtrain::Error naming parallel.comm's deck line when the
// deck asks for nccl and it cannot (status 2 for the build or the device, 3 when compute ranks
// share a GPU); the caller agrees on it over the job (core/agreement), so the whole job ends
// within seconds.
std::string nccl_unavailable_here(const Deck& deck, const std::string& gpu_shared);

// Collective over the job (`layout.world()`): NCCL when the deck allows it and no compute rank
// has a reason against it (`why_not_here`: nccl_unavailable_here on compute ranks, "" on
// holders). Every rank gets the same choice.
CommChoice agree_on_comm(const Deck& deck, const Layout& layout, const std::string& why_not_here);

// A compute rank's groups. `model_tp` is what the model's tensor-parallel calls go to: NCCL on
// device memory, or MPI behind host staging (device/host_staging) on a GPU, or MPI directly on
// the CPU. Collective over the compute ranks (each NCCL id is broadcast within its group).
struct ComputeComms {
  std::unique_ptr<Collectives> tp;       // the tp group
  std::unique_ptr<TensorParallelOps> staged_tp;  // MPI on a GPU: tp behind host staging
  std::unique_ptr<Collectives> dp;       // NCCL only: the replicas, on device memory (else the
                                         // GradReducer's own MPI collectives, host memory)
  std::unique_ptr<Collectives> pp;       // the pipeline's neighbours
  TensorParallelOps& model_tp() const { return staged_tp ? *staged_tp : *tp; }
};
ComputeComms make_compute_comms(const CommChoice& choice, const Layout& layout, Device& device);

}  // namespace pdtrain
