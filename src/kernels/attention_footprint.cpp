// The CUDA backend's attention buffers, known without a GPU (kernel_ops.hpp): the fused kernels'
// (src/kernels/cuda/flash_attention.hpp; tests/backend/cuda checks the two agree) where they
// take the shape, the reference algorithm's elsewhere, as CudaKernelOps chooses.
#include "pdtrain/kernels/kernel_ops.hpp"

namespace pdtrain::kernels {
namespace {

class CudaAttentionFootprint final : public AttentionFootprint {
 public:
  Index saved_floats(const AttentionShape& s) const override {
    return fused_attention_takes(s) ? rows(s) : cpu_attention().saved_floats(s);
  }
  Index scratch_floats(const AttentionShape& s) const override {
    return fused_attention_takes(s) ? rows(s) : cpu_attention().scratch_floats(s);
  }

 private:
  static Index rows(const AttentionShape& s) { return Index(s.B) * s.NH * s.T; }  // one per row
};

}  // namespace

const AttentionFootprint& cuda_attention_footprint() {
  static const CudaAttentionFootprint footprint;
  return footprint;
}

}  // namespace pdtrain::kernels
