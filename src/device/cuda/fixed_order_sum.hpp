#pragma once
// The one kernel of the NCCL collectives (src/device/cuda/fixed_order_sum.cu): a rank's segment
// summed over the group in rank order 0, 1, ..., n-1 in fp32, as core/fixed_order_reduce adds
// on the host, so NCCL's sums are the MPI path's bits.
#include <cuda_runtime_api.h>

#include <cstdint>

namespace pdtrain {

// out[i] = ((copy_0[i] + copy_1[i]) + copy_2[i]) + ... for i < n, where copy_r is
// `received` + r * n for r != me and `mine` for r == me (received's own row is not read).
// `out` may be `mine`, not `received`. Queued on `stream`.
void sum_in_rank_order(cudaStream_t stream, float* out, const float* mine, const float* received,
                       std::int64_t n, int ranks, int me);

}  // namespace pdtrain
