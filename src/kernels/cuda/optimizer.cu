// The replicated baseline's optimizer step on the GPU: block tiles gathered to / scattered from
// the packed block order, per-block sums of squares, AdamW. Compiled with --fmad=false
// (cmake/PdtrainCuda.cmake) and IEEE division and square root (nvcc's defaults), so that every
// value is the holders' CPU value bit for bit (adamw_math.hpp holds the arithmetic for both).
#include <vector>

#include "common.cuh"
#include "launch.hpp"

namespace pdtrain::kernels::cuda {
namespace {

constexpr unsigned kMaxGridY = 65535;  // tiles / blocks per launch (grid.y)

// Grid (x: slices of a tile's elements, y: the tile); each thread walks its tile's packed
// elements k and the strided element (k / cols, k % cols) they come from.
__global__ void copy_tiles_kernel(const TileDesc* __restrict__ tiles, int first, bool to_packed,
                                  float* packed, float* data, bf16* data_bf16) {
  const TileDesc t = tiles[first + blockIdx.y];
  const Index n = t.rows * t.cols;
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < n;
       k += Index(gridDim.x) * blockDim.x) {
    const Index at = t.offset + (k / t.cols) * t.ld + k % t.cols;
    if (to_packed) {
      packed[t.packed + k] = data[at];
    } else if (data_bf16 != nullptr) {
      const bf16 h = pdtrain::to_bf16(packed[t.packed + k]);
      data_bf16[at] = h;
      data[at] = pdtrain::to_float(h);
    } else {
      data[at] = packed[t.packed + k];
    }
  }
}

// Per block of the packed array: its offset, size and first chunk.
struct SumsqBlock {
  Index offset = 0, size = 0, first_chunk = 0;
};

// Stage 1 (grid y: the block, x: its chunks): one thread sums one chunk in adamw_math's order.
__global__ void chunk_sums_kernel(const SumsqBlock* __restrict__ blocks, int first,
                                  const float* __restrict__ packed, double* __restrict__ chunks) {
  const SumsqBlock b = blocks[first + blockIdx.y];
  const Index count = (b.size + kSumsqChunk - 1) / kSumsqChunk;
  const float* g = packed + b.offset;
  const auto at = [g](Index i) { return g[i]; };
  for (Index c = Index(blockIdx.x) * blockDim.x + threadIdx.x; c < count;
       c += Index(gridDim.x) * blockDim.x) {
    const Index begin = c * kSumsqChunk;
    const Index len = b.size - begin < kSumsqChunk ? b.size - begin : kSumsqChunk;
    chunks[b.first_chunk + c] = sumsq_chunk(at, begin, len);
  }
}

// Stage 2: one thread per block adds its chunk sums in order.
__global__ void block_sums_kernel(const SumsqBlock* __restrict__ blocks, int n,
                                  const double* __restrict__ chunks, double* __restrict__ sumsq) {
  const Index i = global_thread();
  if (i >= n) return;
  const SumsqBlock b = blocks[i];
  const Index count = (b.size + kSumsqChunk - 1) / kSumsqChunk;
  double s = 0.0;
  for (Index c = 0; c < count; ++c) s = __dadd_rn(s, chunks[b.first_chunk + c]);
  sumsq[i] = s;
}

__global__ void adamw_kernel(float* __restrict__ param, float* __restrict__ m,
                             float* __restrict__ v, const float* __restrict__ grad, Index n,
                             AdamWStep step) {
  for (Index i = global_thread(); i < n; i += grid_threads())
    adamw_element(step, grad[i], param[i], m[i], v[i]);
}

template <class T>
void upload(cudaStream_t stream, void* dst, const T* src, std::size_t count) {
  if (count > 0)
    CUDA_CHECK(cudaMemcpyAsync(dst, src, count * sizeof(T), cudaMemcpyHostToDevice, stream));
}

}  // namespace

std::size_t tiles_scratch_bytes(std::size_t tiles) { return tiles * sizeof(TileDesc); }

void copy_tiles(cudaStream_t stream, void* scratch, const TileDesc* tiles_host, int tiles,
                Index max_tile_numel, bool to_packed, float* packed, float* data,
                bf16* data_bf16) {
  if (tiles <= 0 || max_tile_numel <= 0) return;
  upload(stream, scratch, tiles_host, static_cast<std::size_t>(tiles));
  const auto* dev = static_cast<const TileDesc*>(scratch);
  const unsigned gx = grid_for(max_tile_numel) < 64 ? grid_for(max_tile_numel) : 64;
  for (int first = 0; first < tiles; first += static_cast<int>(kMaxGridY)) {
    const unsigned gy = static_cast<unsigned>(tiles - first < int(kMaxGridY) ? tiles - first
                                                                              : int(kMaxGridY));
    PDTRAIN_LAUNCH(copy_tiles_kernel, dim3(gx, gy), kBlock, 0, stream)(
        dev, first, to_packed, packed, data, data_bf16);
    CUDA_CHECK_LAUNCH();
  }
}

std::size_t sumsq_scratch_bytes(const Index* sizes, int blocks) {
  Index chunks = 0;
  for (int b = 0; b < blocks; ++b) chunks += (sizes[b] + kSumsqChunk - 1) / kSumsqChunk;
  return static_cast<std::size_t>(blocks) * sizeof(SumsqBlock) +
         static_cast<std::size_t>(chunks) * sizeof(double);
}

void block_sums_of_squares(cudaStream_t stream, void* scratch, double* sumsq, const float* packed,
                           const Index* sizes, int blocks) {
  if (blocks <= 0) return;
  std::vector<SumsqBlock> desc(static_cast<std::size_t>(blocks));
  Index offset = 0, chunks = 0, most = 0;
  for (int b = 0; b < blocks; ++b) {
    desc[b] = SumsqBlock{offset, sizes[b], chunks};
    const Index count = (sizes[b] + kSumsqChunk - 1) / kSumsqChunk;
    offset += sizes[b], chunks += count;
    most = count > most ? count : most;
  }
  upload(stream, scratch, desc.data(), desc.size());
  const auto* dev = static_cast<const SumsqBlock*>(scratch);
  auto* chunk_sums = reinterpret_cast<double*>(static_cast<char*>(scratch) +
                                               desc.size() * sizeof(SumsqBlock));
  if (most > 0) {
    const unsigned gx = static_cast<unsigned>(ceil_div(most, kBlock));
    for (int first = 0; first < blocks; first += static_cast<int>(kMaxGridY)) {
      const unsigned gy = static_cast<unsigned>(
          blocks - first < int(kMaxGridY) ? blocks - first : int(kMaxGridY));
      PDTRAIN_LAUNCH(chunk_sums_kernel, dim3(gx, gy), kBlock, 0, stream)(
          dev, first, packed, chunk_sums);
      CUDA_CHECK_LAUNCH();
    }
  }
  PDTRAIN_LAUNCH(block_sums_kernel,
                 static_cast<unsigned>(ceil_div(blocks, kBlock)), kBlock, 0, stream)(
      dev, blocks, chunk_sums, sumsq);
  CUDA_CHECK_LAUNCH();
}

void adamw(cudaStream_t stream, float* param, float* m, float* v, const float* grad, Index n,
           const AdamWStep& step) {
  if (n <= 0) return;
  PDTRAIN_LAUNCH(adamw_kernel, grid_for(n), kBlock, 0, stream)(param, m, v, grad, n, step);
  CUDA_CHECK_LAUNCH();
}

}  // namespace pdtrain::kernels::cuda
