#pragma once
// The emulated CUDA target's <mma.h> (a test tool, docs/cuda-emulation.md): the warp matrix
// operations (WMMA, namespace nvcuda::wmma) that pdtrain's .cu sources use, with CUDA's names,
// so that the same source compiles under nvcc: 16x16x16 fragments of bf16 matrix_a / matrix_b
// (row_major or col_major) and fp32 accumulators; fill_fragment, load_matrix_sync,
// store_matrix_sync, mma_sync.
//
// Semantics as a GPU's (emulation/cuda/src/wmma.cpp):
//  * load, store and mma are warp-collective: every lane of the warp calls them, converged, with
//    the same pointer, leading dimension and layout; a lane that never joins, a lane in another
//    call, or lanes with different arguments is a fault naming the kernel, block and thread.
//    The pointer must be 256-bit aligned and ldm a multiple of 16 bytes, as CUDA requires.
//  * Which matrix element a lane's x[i] holds is unspecified on a GPU (and differs between
//    architectures). The emulation scatters the 256 elements over the lanes by a fixed
//    pseudo-random permutation, different for matrix_a, matrix_b and the accumulator, so a
//    kernel that assumes any particular mapping computes wrong numbers here. Kernels may touch
//    x[] only element-wise and uniformly (fill, scale) or through load/store.
//  * mma_sync: d = c + a b, each element's dot product of bf16 values (exact fp32 products)
//    summed in fp32 in k order, then added to c. Tensor cores round and order internally in
//    ways NVIDIA does not document: results on a GPU may differ in the last bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

namespace cuda_emu::wmma {

enum class Use { matrix_a, matrix_b, accumulator };
constexpr int kElementsPerLane = 8;  // 256 elements over 32 lanes

// This lane's elements of a 16x16 matrix at ptr (element (r, c) at ptr[r*ldm + c], or
// ptr[c*ldm + r] when col_major) into x (bf16 for matrix_a / matrix_b, float for the
// accumulator); store: the accumulator's elements from x.
void load(Use use, void* x, const void* ptr, unsigned ldm, bool col_major);
void store(float* ptr, const float* x, unsigned ldm, bool col_major);
// d = c + a b over the warp's fragments (this lane's parts).
void mma(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c);

}  // namespace cuda_emu::wmma

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <class Use, int m, int n, int k, class T, class Layout = void>
class fragment {
  static_assert(m == 16 && n == 16 && k == 16, "the emulation has 16x16x16 fragments only");
  static_assert(std::is_same_v<Use, accumulator>
                    ? std::is_same_v<T, float> && std::is_void_v<Layout>
                    : std::is_same_v<T, __nv_bfloat16> &&
                          (std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>),
                "the emulation has bf16 matrix_a/matrix_b (row_major or col_major) and float "
                "accumulators only");

 public:
  using element_type = T;
  static constexpr int num_elements = cuda_emu::wmma::kElementsPerLane;
  T x[num_elements];
};

template <class Use, int m, int n, int k, class T, class Layout, class V>
inline void fill_fragment(fragment<Use, m, n, k, T, Layout>& f, const V& v) {
  for (T& e : f.x) e = static_cast<T>(v);
}

template <class Use, int m, int n, int k, class Layout>
inline void load_matrix_sync(fragment<Use, m, n, k, __nv_bfloat16, Layout>& f,
                             const __nv_bfloat16* p, unsigned ldm) {
  constexpr auto use = std::is_same_v<Use, matrix_a> ? cuda_emu::wmma::Use::matrix_a
                                                     : cuda_emu::wmma::Use::matrix_b;
  cuda_emu::wmma::load(use, f.x, p, ldm, std::is_same_v<Layout, col_major>);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  cuda_emu::wmma::load(cuda_emu::wmma::Use::accumulator, f.x, p, ldm, layout == mem_col_major);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  cuda_emu::wmma::store(p, f.x, ldm, layout == mem_col_major);
}

template <class LayoutA, class LayoutB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
                     const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
                     const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  cuda_emu::wmma::mma(d.x, a.x, b.x, c.x);
}

}  // namespace nvcuda::wmma
