#pragma once
// The cuDNN attention family (cudnn_attention.cpp): cuDNN's fused causal attention
// (cudnn_sdpa.hpp) where cuDNN runs the call, pdtrain's own attention family elsewhere.
#include <cuda_runtime_api.h>

#include <functional>
#include <memory>

#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels::cuda {

// `device_scratch(floats)`: the device's scratch (at least that many floats, valid until the
// next call; cuDNN's workspace and the bf16 copies live there). `pdtrain_attention`: the family
// that runs what cuDNN does not: fp32 runs (cuDNN's fused attention is 16-bit only) and the
// shapes cuDNN refuses. `required` (compute.attention = "cudnn"): a bf16 run's shape that cuDNN
// refuses is an error; otherwise (auto) pdtrain's kernel runs it. Either way each reason for
// running pdtrain's kernel is said once on stderr.
std::unique_ptr<AttentionOps> make_cudnn_attention(
    cudaStream_t stream, std::function<float*(Index floats)> device_scratch,
    std::unique_ptr<AttentionOps> pdtrain_attention, bool required);

}  // namespace pdtrain::kernels::cuda
