#pragma once
// The emulated CUDA target's PTX primitives (a test tool, docs/cuda-emulation.md): what
// src/kernels/cuda/mma_sm80.cuh writes as inline PTX under nvcc, here calls into the emulation
// (emulation/cuda/src/ptx.cpp). Registers are 32-bit words; a word holding two 16-bit elements
// has the element of lower index in its low half, as PTX packs .bf16x2.
//
// Fragment layouts are the PTX ISA's (parallel-thread-execution, "Warp Level Matrix Multiply-
// Accumulate Instructions"), exactly; with groupID = lane / 4 and tig = lane % 4:
//  * ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 ("Warp-level matrix load
//    instruction: ldmatrix"): lanes 8m..8m+7 give the addresses of rows 0..7 of matrix m (16
//    bytes each, 16-byte aligned, in shared memory); register m of lane l receives row l / 4,
//    columns 2 (l % 4) and 2 (l % 4) + 1 of matrix m, or with .trans the elements at row
//    2 (l % 4) + j, column l / 4 (j = 0, 1).
//  * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 ("Matrix Fragments for
//    mma.m16n8k16 with floating point type"): A (16 x 16, four words a0..a7) holds row
//    groupID + 8 [i in 2,3,6,7], column 2 tig + (i & 1) + 8 [i >= 4] in element a_i; B (16 x 8,
//    two words b0..b3) holds row (k) 2 tig + (i & 1) + 8 [i >= 2], column groupID; C and D
//    (16 x 8 fp32, c0..c3) hold row groupID + 8 [i >= 2], column 2 tig + (i & 1).
//    d = c + a b with each element's exact bf16 products summed in fp32 in k order, then added
//    to c (the emulated WMMA's arithmetic, tensor_core.hpp).
//  * cp.async.cg.shared.global [dst], [src], 16, src_size ("Data Movement and Conversion
//    Instructions: cp.async"): copies src_size bytes (0..16) of global memory to shared memory
//    and zero-fills the rest of the 16; both addresses 16-byte aligned. cp.async.commit_group
//    closes this thread's uncommitted copies into a group; cp.async.wait_group N returns when at
//    most N of its most recent groups are pending. Here a copy lands exactly when a wait covers
//    its group, and until then its 16 destination bytes hold 0xff (a bf16 or fp32 NaN): a
//    kernel that reads a tile before waiting for it (or before the __syncthreads that makes the
//    other threads' copies visible) reads NaN, or differs between the race check's two orders.
//
// ldmatrix and mma are warp-collective (.sync.aligned): every lane calls, converged, the same
// shape; else a fault naming the kernel, block and thread, as for WMMA. Misaligned or
// wrong-space addresses are faults too.
#include <cuda_runtime.h>

namespace cuda_emu::ptx {

// ldmatrix of `matrices` (1, 2, 4) 8x8 b16 matrices: this lane's row address, its registers.
void ldmatrix(unsigned* regs, int matrices, bool trans, const void* row);
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: d = a b + c (this lane's fragments;
// d may be c).
void mma_m16n8k16_bf16(float* d, const unsigned* a, const unsigned* b, const float* c);
// cp.async.cg.shared.global of 16 bytes, src_bytes (0..16) of them from src.
void cp_async_16(void* dst_shared, const void* src_global, int src_bytes);
void cp_async_commit_group();
void cp_async_wait_group(int pending);

}  // namespace cuda_emu::ptx
