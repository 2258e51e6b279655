#pragma once
// cuDNN's fused causal attention (scaled dot-product attention through cuDNN's graph API) over
// pdtrain's activation layout, for the cuDNN attention family (cudnn_attention.cpp).
//
// Layout: qkv[B,T,3,NH,HS] bf16 (per token q of all heads | k | v), so Q, K and V are strided
// views of it ([B,NH,T,HS] with strides {T*3C, HS, 3C, 1}, no permute copies); out[B,T,NH,HS]
// bf16; stats[B,NH,T] fp32, the log-sum-exp of each row's scaled scores (what pdtrain's own fused
// kernel saves too, flash_attention.hpp); the gradients dq, dk, dv are written in bf16 into
// dqkv[B,T,3,NH,HS] (overwritten). Scale 1/sqrt(HS), causal (query t sees keys 0..t).
//
// The graphs are the composite ones cudnn-frontend builds for its SDPA node (and llm.c uses):
// forward Q K^T, scale, causal mask (row index >= column index, else -inf), softmax (max,
// subtract, exp, sum, divide) with stats = max + log(sum), then P V; backward from Q, K, V, O,
// dO and stats: D = rowsum(dO * O), P = exp(scaled masked scores - stats), dV = P^T dO,
// dS = P (dO V^T - D) scale, dQ = dS K, dK = dS^T Q. Built with cuDNN's backend API (the
// descriptors directly: docs/architecture.md says why not cudnn-frontend), once per shape and
// cached, with the first engine cuDNN's heuristics give that builds; the backward takes only
// an engine without CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC (pdtrain's ops are deterministic).
// A shape cuDNN refuses is an answer (refusal()), for the family to fall back on its own kernel.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <memory>
#include <string>

#include "pdtrain/core/bf16.hpp"

namespace pdtrain::kernels::cuda {

struct SdpaShape {
  int B = 0, T = 0, NH = 0, HS = 0;
  auto operator<=>(const SdpaShape&) const = default;
};

// cuDNN's version as "9.19.0" (the library's, cudnnGetVersion).
std::string cudnn_version();

class CudnnSdpa {
 public:
  // cuDNN's handle on `stream` (every execution is queued there).
  explicit CudnnSdpa(cudaStream_t stream);
  ~CudnnSdpa();
  CudnnSdpa(const CudnnSdpa&) = delete;
  CudnnSdpa& operator=(const CudnnSdpa&) = delete;

  // "" when cuDNN runs the shape's forward and a deterministic backward; else why not (cuDNN's
  // answer). Builds and caches the shape's plans.
  const std::string& refusal(const SdpaShape& s);
  // Bytes of workspace the shape's plans need (the larger of forward and backward), 256-byte
  // multiples; the backward's softmax sums follow the workspace (backward_scratch_bytes).
  std::size_t workspace_bytes(const SdpaShape& s);
  std::size_t backward_scratch_bytes(const SdpaShape& s);

  // The shape must be one refusal() says "" of. Device pointers; workspace holds
  // workspace_bytes(s) (forward) or backward_scratch_bytes(s) (backward), 256-byte aligned.
  void forward(const SdpaShape& s, bf16* out, float* stats, const bf16* qkv, void* workspace);
  void backward(const SdpaShape& s, bf16* dqkv, const bf16* dout, const bf16* qkv,
                const bf16* out, const float* stats, void* workspace);

 private:
  struct Plans;
  Plans& plans(const SdpaShape& s);

  cudaStream_t stream_;
  void* handle_ = nullptr;       // cudnnHandle_t; null when cudnnCreate failed
  std::string handle_refusal_;   // why cudnnCreate failed
  std::map<SdpaShape, std::unique_ptr<Plans>> cache_;
};

}  // namespace pdtrain::kernels::cuda
