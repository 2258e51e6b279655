#pragma once
// The NCCL implementation of the collectives seam (core/collectives.hpp) between compute ranks'
// GPUs, built with -DPDTRAIN_CUDA=ON when the toolkit has NCCL (src/device/cuda/
// nccl_collectives.cpp); other builds have src/device/no_nccl/, where nccl_built() is false and
// asking for NCCL is an error. This header includes neither CUDA nor NCCL nor MPI: the id of a
// group is created on its first rank and broadcast by the caller over the group's MPI
// communicator, which holds compute ranks only (holders never join a NCCL communicator).
//
// Every operation takes device memory of the rank's CUDA device and runs on a stream of its own:
// it starts after the work queued so far on the compute queue (an event), and later compute
// work waits for it (another event); the host never waits. Sums are the MPI path's bits
// (core/fixed_order_reduce): a reduce-scatter sends every rank its segment of each peer's data
// (grouped ncclSend/ncclRecv into a [ranks][segment] buffer) and one kernel adds the copies in
// rank order 0..n-1 in fp32 (src/device/cuda/fixed_order_sum.cu); an all-gather sends copies;
// the tensor-parallel all-reduce is the two over even segments. So NCCL's own summation order
// (its ring or tree) never decides a bit: runs repeat their bits and equal the MPI path's.
// pin_deterministic_nccl still pins the algorithm for the one NCCL reduction left (max, exact
// in any order) and for the run header.
//
// A failed peer: while the host waits on the device (CudaDevice::synchronize, wait_host), the
// communicators' ncclCommGetAsyncError is polled; an error aborts the communicator
// (ncclCommAbort) and ends the whole job at once (pdtrain::fatal_abort: "error (rank R): NCCL
// dp group (rank r of n): <NCCL's error>: <what it waited for>"), as a failed NCCL call does.
// A stalled peer (alive, but never posting its side: NCCL waits for it forever, with no error):
// in the same polls a watchdog follows the communicator's stream, one unit of work per
// operation (an event where its inputs are ready on the compute stream, one where it is done);
// when the oldest unit has had its inputs ready and not finished for longer than
// `stall_limit_s` (parallel.nccl_timeout_s), the communicator is aborted and the job ends the
// same way ("... no progress for 600.2 s (parallel.nccl_timeout_s = 600 s) waiting on its peers
// for <operation>; a stalled peer? ..."). Time the stream is idle or waits for the compute
// stream (a long kernel) never counts.
#include <array>
#include <memory>
#include <string>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/device/device.hpp"

namespace pdtrain {

using NcclId = std::array<char, 128>;  // ncclUniqueId's bytes (NCCL_UNIQUE_ID_BYTES)

bool nccl_built();
std::string nccl_version();  // "2.28.3"; "" when not built

// A new group's id, on the group's first rank (ncclGetUniqueId).
NcclId make_nccl_id();

// Pins what decides NCCL's order of additions, unless the environment already sets it:
// NCCL_ALGO=Ring, NCCL_PROTO=Simple, NCCL_NVLS_ENABLE=0 (NVLink SHARP adds in the switch),
// NCCL_COLLNET_ENABLE=0. Returns the settings in force, for the run header.
std::string pin_deterministic_nccl();

// Collective over the group's `size` ranks, each with its `rank` and the same `id`; `device`
// must be the rank's CUDA device (its GPU is made current); `group` ("tp", "dp", "pp") names it
// in errors; `stall_limit_s` is the watchdog's limit (above; 0: none). Throws pdtrain::Error
// when NCCL is not built or the device is not a GPU; a failed NCCL call ends the job
// (NCCL_CHECK).
std::unique_ptr<Collectives> make_nccl_collectives(Device& device, int rank, int size,
                                                   const NcclId& id, const std::string& group,
                                                   double stall_limit_s);

}  // namespace pdtrain
