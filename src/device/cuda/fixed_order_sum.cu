// The NCCL reduce-scatter's sum (fixed_order_sum.hpp): one grid-stride loop, each element added
// in rank order with one fp32 addition per rank (no contraction: there is no multiplication),
// exactly as FixedOrderReducer adds on the host.
#include "fixed_order_sum.hpp"

#include "../../kernels/cuda/common.cuh"

namespace pdtrain {
namespace {

using kernels::cuda::Index;

__global__ void sum_in_rank_order_kernel(float* out, const float* mine, const float* received,
                                         Index n, int ranks, int me) {
  for (Index i = kernels::cuda::global_thread(); i < n; i += kernels::cuda::grid_threads()) {
    float s = me == 0 ? mine[i] : received[i];
    for (int r = 1; r < ranks; ++r) s += r == me ? mine[i] : received[Index(r) * n + i];
    out[i] = s;
  }
}

}  // namespace

void sum_in_rank_order(cudaStream_t stream, float* out, const float* mine, const float* received,
                       std::int64_t n, int ranks, int me) {
  if (n <= 0) return;
  PDTRAIN_LAUNCH(sum_in_rank_order_kernel, kernels::cuda::grid_for(n), kernels::cuda::kBlock, 0,
                 stream)(out, mine, received, n, ranks, me);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain
