#pragma once
// Where each compute rank computes (compute.device): the CPU, or one NVIDIA GPU per compute rank
// chosen by the rank's index among the compute ranks of its node (modulo the node's GPUs, so
// several ranks may share one GPU). Holders never touch a GPU.
#include <string>

#include "pdtrain/app/setup.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/layout/layout.hpp"

namespace pdtrain {

// The index of compute rank `rank` (run order) among its node's compute ranks.
int node_local_compute_index(const Setup& setup, int rank);

// This compute rank's backend. Throws pdtrain::Error naming compute.device when the deck asks
// for cuda in a build without it (exit 2), and naming the rank when no GPU is visible (exit 1);
// the caller agrees on it over the job (core/agreement), so the job ends within seconds.
kernels::ComputeBackend make_compute_backend(const Deck& deck, const Setup& setup,
                                             const Layout& layout);

// For --dry-run: "cpu", or "cuda GPU 3 of node 1 (its compute rank 3, modulo the node's GPUs)".
std::string describe_compute_device(const Deck& deck, const Setup& setup, int rank);

}  // namespace pdtrain
