// Stage 2 of the deterministic column sums, and the slabs both stages use (stage 1:
// column_sums.cuh, for matmul.cu's bias gradient and layernorm.cu's weight and bias
// gradients). See launch.hpp.
#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr Index kMinSlabRows = 32;  // below this a slab is not worth a thread
constexpr Index kMaxSlabs = 256;    // bounds the scratch to 256 rows of partial sums

// One thread per (array, column): the slabs' partial sums added in slab order, then onto out.
__global__ void column_sums_finish_kernel(ColumnSumsOut out, const float* __restrict__ partial,
                                          Index slabs, int sums, int cols) {
  const Index i = global_thread();
  if (i >= Index(sums) * cols) return;
  const int k = static_cast<int>(i / cols), c = static_cast<int>(i % cols);  // once a thread
  const float* p = partial + k * slabs * cols;
  float acc = 0.0f;
  for (Index s = 0; s < slabs; ++s) acc += p[s * cols + c];
  out.to[k][c] += acc;
}

}  // namespace

Slabs column_slabs(Index rows) {
  Slabs s;
  if (rows <= 0) return s;
  const Index even = ceil_div(rows, kMaxSlabs);
  s.rows = even > kMinSlabRows ? even : kMinSlabRows;
  s.count = ceil_div(rows, s.rows);  // <= kMaxSlabs
  return s;
}

void column_sums_finish(cudaStream_t stream, ColumnSumsOut out, int sums, const float* partial,
                        Index slabs, int cols) {
  if (slabs <= 0 || cols <= 0 || sums <= 0) return;
  PDTRAIN_LAUNCH(column_sums_finish_kernel,
                 static_cast<unsigned>(ceil_div(Index(sums) * cols, kBlock)), kBlock, 0, stream)(
      out, partial, slabs, sums, cols);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
