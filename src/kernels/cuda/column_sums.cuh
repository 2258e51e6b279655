#pragma once
// Column sums in two deterministic stages (launch.hpp), for any op: stage 1 here, thread
// (column c, slab) adding its slab's rows in order, K sums at once; stage 2 (column_sums.cu)
// adding the slabs in order onto the outputs. Device code: included by the .cu files.
#include <array>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {

// Stage 1: partial[k][slab][c] = the sum over the slab's rows n, in order, of term k of (n, c),
// which `rows(n, c, acc)` adds onto acc[k]; one thread's (column c, slab) of `slabs`. A device
// function, so a kernel with other work may run it in some of its blocks (layernorm.cu).
template <int K, class Rows>
__device__ __forceinline__ void column_partials(float* __restrict__ partial, Index N, int C,
                                                Index slab_rows, Index slabs, Index c,
                                                Index slab, const Rows& rows) {
  if (c >= C) return;
  const Index begin = slab * slab_rows;
  const Index end = begin + slab_rows < N ? begin + slab_rows : N;
  float acc[K] = {};
  for (Index n = begin; n < end; ++n) rows(n, c, acc);
#pragma unroll
  for (int k = 0; k < K; ++k) partial[(k * slabs + slab) * C + c] = acc[k];
}

// Stage 1 alone: a grid of (column blocks, slabs).
template <int K, class Rows>
__global__ void column_partials_kernel(float* __restrict__ partial, Index N, int C,
                                       Index slab_rows, Rows rows) {
  column_partials<K>(partial, N, C, slab_rows, gridDim.y, Index(blockIdx.x) * blockDim.x + threadIdx.x,
                     blockIdx.y, rows);
}

template <int K>
ColumnSumsOut column_sums_out(const std::array<float*, K>& out) {
  static_assert(K <= kMaxColumnSums, "column_sums_finish sums at most kMaxColumnSums arrays");
  ColumnSumsOut o;
  for (int k = 0; k < K; ++k) o.to[k] = out[k];
  return o;
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
  column_sums_finish(stream, column_sums_out<K>(out), K, scratch, slabs.count, C);
}

}  // namespace pdtrain::kernels::cuda
