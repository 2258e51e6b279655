#pragma once
// The GPT-2 step's kernels as one interface, implemented once per backend:
//   CpuKernelOps  (src/kernels/cpu_kernel_ops.cpp): the Kokkos kernels of gpt_kernels.hpp and
//                 the GEMM layer (oneDNN or CBLAS) on host memory;
//   CudaKernelOps (src/kernels/cuda/): CUDA kernels, one file per op with its forward beside
//                 its backward, and cuBLASLt GEMMs, on one GPU's compute stream.
// The model (GptStage) calls only these, so the same model code runs on either.
//
// Conventions (those of gpt_kernels.hpp, which is the reference every backend is tested
// against): row-major raw pointers in the backend's device memory, llm.c's shapes (B batch,
// T sequence, C channels, NH heads, N = B*T rows, under tensor parallelism the LOCAL width and
// head count); every backward ACCUMULATES (+=) into its gradient outputs; pointers documented
// as "may be null" are skipped when null. Ops are queued on the device's compute queue in call
// order: the host reads results only after Device::synchronize() (or a download).
// Determinism: every op gives the same bits run to run (no float atomics; reductions in a fixed
// order). Backends agree within stated tolerances (tests/backend/test_kernel_ops.cpp), not
// bit for bit: a GPU sums in another order than the CPU.
#include <cstdint>
#include <memory>
#include <string>

#include <vector>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/optim/adamw_math.hpp"

namespace pdtrain::kernels {

using Index = std::int64_t;

class KernelOps {
 public:
  virtual ~KernelOps() = default;
  // "cpu: Kokkos Serial, oneDNN 2.7 ..." or "cuda: cuBLASLt 13.0, fp32 without TF32".
  virtual std::string describe() const = 0;

  // --- Fill and conversion
  virtual void fill(float* p, Index n, float value) = 0;
  virtual void to_bf16(bf16* out, const float* in, Index n) = 0;

  // --- Encoder: out[b,t,:] = wte[tokens[b,t] - vocab_begin,:] + wpe[t,:] (vocabulary shard
  // [vocab_begin, vocab_end): other tokens contribute 0; wpe may be null).
  virtual void encoder_forward(float* out, const std::int32_t* tokens, const float* wte,
                               const float* wpe, int B, int T, int C, int vocab_begin,
                               int vocab_end) = 0;
  // dwte (may be null) += scatter of dout by token; dwpe (may be null) += dout summed over b.
  virtual void encoder_backward(float* dwte, float* dwpe, const float* dout,
                                const std::int32_t* tokens, int B, int T, int C, int vocab_begin,
                                int vocab_end) = 0;

  // --- LayerNorm (eps 1e-5): out[N,C] as fp32 or as bf16 (the input of a bf16 matmul);
  // mean[N], rstd[N] saved for backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int N, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int N, int C) = 0;

  // --- Matmul: out[N,OC] = inp[N,C] weight[OC,C]^T + bias[OC] (bias may be null).
  // fp32, or bf16 inputs and weights with fp32 accumulation and output.
  virtual void matmul_forward(float* out, const float* inp, const float* weight,
                              const float* bias, int N, int C, int OC) = 0;
  virtual void matmul_forward(float* out, const bf16* inp, const bf16* weight, const float* bias,
                              int N, int C, int OC) = 0;
  // dinp (may be null) += dout weight; dweight += dout^T inp; dbias (may be null) += column
  // sums of dout. bf16: dout is rounded once into dout_bf16 [N*OC] for both products; the bias
  // gradient uses the fp32 dout.
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, int N, int C, int OC) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               bf16* dout_bf16, const bf16* inp, const bf16* weight, int N, int C,
                               int OC) = 0;
  // out[N,OC] += bias[OC] (a row-parallel layer's bias, added after the tensor-parallel sum).
  virtual void bias_add_forward(float* out, const float* bias, int N, int OC) = 0;

  // --- Causal self-attention over qkv[B,T,3C] (per token: q of all heads | k | v, head h at
  // h*HS): out[B,T,C]; preatt/att [B,NH,T,T] (att saved for backward; masked entries 0).
  virtual void attention_forward(float* out, float* preatt, float* att, const float* qkv, int B,
                                 int T, int C, int NH) = 0;
  // dqkv += ...; dpreatt/datt [B,NH,T,T] are scratch, overwritten.
  virtual void attention_backward(float* dqkv, float* dpreatt, float* datt, const float* dout,
                                  const float* qkv, const float* att, int B, int T, int C,
                                  int NH) = 0;

  // --- GELU (tanh form): out = gelu(inp) as fp32 or bf16; dinp += gelu'(inp) dout.
  virtual void gelu_forward(float* out, const float* inp, Index n) = 0;
  virtual void gelu_forward(bf16* out, const float* inp, Index n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, Index n) = 0;

  // --- Residual: out = a + b (its backward passes the gradient through unchanged).
  virtual void residual_forward(float* out, const float* a, const float* b, Index n) = 0;

  // --- Softmax cross-entropy over a vocabulary shard of V columns starting at vocab_begin, in
  // three phases; the caller combines rowmax (max) and stats (sum) over the shards between them.
  virtual void crossentropy_rowmax(float* rowmax, const float* logits, int N, int V) = 0;
  // probs = exp(logits - rowmax); stats[n] = shard sum, stats[N+n] = target logit - max here.
  virtual void crossentropy_partials(float* stats, float* probs, const float* logits,
                                     const float* rowmax, const std::int32_t* targets,
                                     int vocab_begin, int N, int V) = 0;
  // losses[n] = log(sum) - (target logit - max); probs normalized in place.
  virtual void crossentropy_finish(float* losses, float* probs, const float* stats, int N,
                                   int V) = 0;
  // dlogits += (probs - onehot(target)) * dlosses[n] (target counted on its shard only).
  virtual void crossentropy_backward(float* dlogits, const float* probs,
                                     const std::int32_t* targets, const float* dlosses, int N,
                                     int V, int vocab_begin) = 0;
  // *sum = losses[0] + losses[1] + ... + losses[n-1], in double, in that order (one micro-batch's
  // loss, bit-identical on every backend).
  virtual void sum_losses(double* sum, const float* losses, int n) = 0;

  // --- Blocks and the optimizer: the replicated baseline keeps parameters and AdamW state on
  // its device, packed block after block like the holders' (each block a row-major tile of
  // a stage tensor). Every backend computes these to the same bits as the holders' CPU code
  // (adamw_math.hpp; no FMA contraction), so a GPU baseline equals PD with CPU holders.
  struct Tile {
    Index offset = 0, rows = 0, cols = 0, ld = 0;  // rows x cols at data + offset, row stride ld
  };
  // packed (the tiles back to back, each row-major) <- src's tiles.
  virtual void gather_tiles(float* packed, const float* src, const std::vector<Tile>& tiles) = 0;
  // dst's tiles <- packed. With dst_bf16 (same layout as dst; may be null) the values are
  // rounded to bf16: dst_bf16 gets them and dst their float value (bf16 precision's view).
  virtual void scatter_tiles(float* dst, bf16* dst_bf16, const float* packed,
                             const std::vector<Tile>& tiles) = 0;
  // sumsq[i] = sum of squares of the i-th of the contiguous blocks of `sizes` in `packed`, in
  // adamw_math.hpp's chunked order (sumsq in device memory).
  virtual void block_sums_of_squares(double* sumsq, const float* packed,
                                     const std::vector<Index>& sizes) = 0;
  // AdamW (adamw_element) over n contiguous elements.
  virtual void adamw(float* param, float* m, float* v, const float* grad, Index n,
                     const AdamWStep& step) = 0;
};

// A compute rank's device and the kernels that run on it.
struct ComputeBackend {
  std::unique_ptr<Device> owned_device;  // null for the CPU (cpu_device() is process-wide)
  Device* device = nullptr;
  std::unique_ptr<KernelOps> ops;
  std::string gpu_uuid;  // the CUDA device's UUID ("GPU-..."); empty on the CPU
};

// The CPU backend (always built), and its kernels alone (process-wide; for code that runs on
// the CPU device without choosing a backend: tests, tools, the dry run).
ComputeBackend make_cpu_backend();
KernelOps& cpu_kernel_ops();
// The CUDA backend on GPU `gpu` of this node. Throws pdtrain::Error(runtime) when this build
// has no CUDA backend or the GPU cannot be used.
ComputeBackend make_cuda_backend(int gpu);
// Whether this binary was built with the CUDA backend, and how many GPUs this process sees
// (0 when there is no driver or no device: "no GPU", never an error; `why_none` then gets
// CUDA's reason, e.g. "cudaErrorInsufficientDriver: CUDA driver version is insufficient ...").
bool cuda_backend_built();
int cuda_device_count(std::string* why_none = nullptr);
// Whether GPU `gpu` lets several processes use it at once (compute mode Default; an exclusive
// or prohibited mode refuses ranks that share it). False without the GPU.
bool cuda_gpu_shareable(int gpu);
// GPU `gpu`'s UUID ("GPU-..."), the same in every process of the node; "" without it.
std::string cuda_gpu_uuid(int gpu);
// The backends this binary has, for --version: "cpu" or e.g. "cpu, cuda (sm_90)".
std::string backends_built();

}  // namespace pdtrain::kernels
