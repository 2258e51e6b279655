#pragma once
// Fused causal multi-head self-attention (flash_attention.cu): the same function as
// attention_forward/backward (gpt_kernels.hpp, attention.cu) without the B*NH*T*T score and
// probability arrays. qkv[B,T,3C] holds per token [q of all heads | k | v], head h at h*HS;
// out[B,T,C]. Tiles of queries against tiles of keys and values in shared memory, an online
// softmax; the forward saves only the log-sum-exp of each row's scores, lse[B,NH,T], from which
// the backward recomputes the probabilities.
//
// Precision: with bf16_inputs, q, k, v (and in the backward dout and the probabilities) are
// rounded to bf16 in shared memory and multiplied on tensor cores (mma.sync m16n8k16, fp32
// accumulation; the probabilities and score gradients rounded to bf16 in registers),
// everything else in fp32; without it the same tiles are fp32 and multiplied on
// the CUDA cores in fp32 (an fp32 run never gets bf16 attention).
//
// Activations: qkv and out are fp32, or bf16 (the overloads taking pdtrain::bf16, core/bf16.hpp:
// a bf16 run's activations, as llm.c keeps them). The bf16 ones are read into the tiles and out
// is written from the fp32 result rounded once, in the same kernels (no conversion pass); they
// always run the bf16 tiles (q, k, v are bf16 values already; bf16_inputs changes nothing), and
// the backward's D = rowsum(dout * out) uses the bf16 out. dout, dqkv and lse stay fp32.
//
// Deterministic: no atomics; every sum is in a fixed order that depends on the shape only, so
// the same inputs give the same bits run to run. The backward ACCUMULATES into dqkv (+=), as
// gpt_kernels.hpp's does: one kernel per key tile adds dk and dv, another per query tile dq.
//
// Pointers are device memory; work is queued on `stream`. Head sizes HS = C / NH up to
// kFlashMaxHeadSize (padded to a multiple of 16 in shared memory); any T.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "pdtrain/core/bf16.hpp"

namespace pdtrain::kernels::cuda {

using Index = std::int64_t;

constexpr int kFlashMaxHeadSize = 64;

// Whether these kernels take heads of C / NH channels (NH divides C, HS <= kFlashMaxHeadSize).
bool flash_attention_supported(int C, int NH);

// Floats of the lse array the forward saves for the backward: B*NH*T.
Index flash_attention_saved_floats(int B, int T, int NH);
// Floats of scratch the backward needs (D = rowsum(dout * out) per row): B*NH*T.
Index flash_attention_scratch_floats(int B, int T, int NH);

// out[B,T,C] = attention(qkv); lse[B,NH,T] = log sum_{t2<=t} exp(scale q_t . k_t2) per row.
void flash_attention_forward(cudaStream_t stream, float* out, float* lse, const float* qkv, int B,
                             int T, int C, int NH, bool bf16_inputs);
void flash_attention_forward(cudaStream_t stream, bf16* out, float* lse, const bf16* qkv, int B,
                             int T, int C, int NH, bool bf16_inputs);

// dqkv[B,T,3C] += d(attention)/d(qkv) of dout[B,T,C], given the forward's qkv, out and lse;
// scratch holds at least flash_attention_scratch_floats(B, T, NH) floats (overwritten).
void flash_attention_backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const float* qkv, const float* out, const float* lse, int B, int T,
                              int C, int NH, bool bf16_inputs);
void flash_attention_backward(cudaStream_t stream, float* dqkv, float* scratch, const float* dout,
                              const bf16* qkv, const bf16* out, const float* lse, int B, int T,
                              int C, int NH, bool bf16_inputs);

}  // namespace pdtrain::kernels::cuda
