#pragma once
// The few collectives of the checkpoint library (private). With one holder they make no MPI
// call at all, so a single holder's write also works in a forked child (the crash test); so do
// core/agreement's, which the library uses to agree on errors and strings.
#include <mpi.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pdtrain/ckpt/canonical_crc.hpp"

namespace pdtrain::ckpt::detail {

// Element-wise bitwise OR over the ranks, in place (blocks have one owner, so OR merges the
// per-block arrays that each rank filled for its own blocks).
void allreduce_bor(MPI_Comm comm, std::vector<std::uint32_t>& v);
// Element-wise maximum over the ranks, in place.
void allreduce_max(MPI_Comm comm, std::vector<std::uint32_t>& v);
std::int64_t allreduce_sum(MPI_Comm comm, std::int64_t x);
bool allreduce_and(MPI_Comm comm, bool x);
void bcast_u32(MPI_Comm comm, std::uint32_t& x, int root = 0);
// Every rank's pieces of the canonical parameter array combined on rank 0 into the canonical
// CRC (combine_crc_pieces: nullopt unless they tile [0, total_numel) exactly); nullopt on the
// other ranks.
std::optional<std::uint32_t> combine_crc_pieces_on_root(MPI_Comm comm,
                                                        const std::vector<CrcPiece>& mine,
                                                        std::int64_t total_numel);

}  // namespace pdtrain::ckpt::detail
