#pragma once
// Column sums in two deterministic stages (launch.hpp), for any op: stage 1 here, thread
// (column c, slab) adding its slab's rows in order, K sums at once; stage 2 (column_sums.cu)
// adding the slabs in order onto the outputs. Device code: included by the .cu files.
#include <array>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {

// Stage 1: partial[k][slab][c] = the sum over the slab's rows n, in order, of term k of (n, c),
// which `rows(n, c, acc)` adds onto acc[k].
template <int K, class Rows>
__global__ void column_partials_kernel(float* __restrict__ partial, Index N, int C,
                                       Index slab_rows, Rows rows) {
  const Index c = Index(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const Index slab = blockIdx.y;
  const Index begin = slab * slab_rows;
  const Index end = begin + slab_rows < N ? begin + slab_rows : N;
  float acc[K] = {};
  for (Index n = begin; n < end; ++n) rows(n, c, acc);
#pragma unroll
  for (int k = 0; k < K; ++k) partial[(k * Index(gridDim.y) + slab) * C + c] = acc[k];
}

// Floats of scratch column_sums<K> needs for N rows of C columns.
inline Index column_sums_scratch(int K, Index N, int C) { return K * column_slabs(N).count * C; }

// out[k][c] += the sum over the N rows n of term k of (n, c) (see column_partials_kernel), for
// k < K; `scratch` holds column_sums_scratch(K, N, C) floats.
template <int K, class Rows>
void column_sums(cudaStream_t stream, float* scratch, const std::array<float*, K>& out, Index N,
                 int C, Rows rows) {
  const Slabs slabs = column_slabs(N);
  const dim3 grid(static_cast<unsigned>(ceil_div(C, kBlock)), static_cast<unsigned>(slabs.count));
  PDTRAIN_LAUNCH(column_partials_kernel<K>, grid, kBlock, 0, stream)(
      scratch, N, C, slabs.rows, rows);
  CUDA_CHECK_LAUNCH();
  for (int k = 0; k < K; ++k)
    column_sums_finish(stream, out[k], scratch + k * slabs.count * C, slabs.count, C);
}

}  // namespace pdtrain::kernels::cuda
