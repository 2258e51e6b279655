// The cuDNN attention family (src/kernels/cuda/cudnn_attention.cpp) on GPU 0, as the deck's
// compute.attention makes it: with "cudnn" (cuDNN required for a bf16 run, so these results are
// cuDNN's) against the CPU reference in double on the bf16 qkv (gpt_kernels.hpp), bit-identical
// run to run (the deterministic backward), saving cuDNN's [B,NH,T] statistics only; a shape cuDNN
// refuses is an error naming compute.attention and cuDNN's status; with "auto" the same shape,
// and an fp32 run's attention, are pdtrain's kernel, bit for bit. (The per-backend attention
// tests of test_kernel_ops.cpp run the "auto" family too, as cuda_cudnn.)
#include <string>
#include <vector>

#include "../backend_test_support.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain::kernels::testing {
namespace {

using Vec = std::vector<double>;

// The bf16 attention bounds of test_kernel_ops.cpp (kAttnBf16Forward / kAttnBf16Backward):
// relative to max(1, |ref|), plus out's own bf16 rounding.
constexpr double kForward = 1e-2, kBackward = 4e-2;

struct Outputs {
  std::vector<float> out, dqkv, saved;
};

// forward then backward through `attention` (bf16 activations, or fp32 ones), from garbage
// saved and scratch, dqkv accumulating onto dqkv0.
Outputs run(ComputeBackend& b, const AttentionShape& s, const std::vector<bf16>& qkv,
            const std::vector<float>& dout, const std::vector<float>& dqkv0, bool bf16_activations) {
  Device& dev = *b.device;
  AttentionOps& a = b.ops->attention();
  const std::size_t n = std::size_t(s.B) * s.T * s.C;
  auto saved = to_device(dev, std::vector<float>(std::size_t(a.saved_floats(s)), 7.0f));
  auto scratch = to_device(dev, std::vector<float>(std::size_t(a.scratch_floats(s)), 7.0f));
  auto g = to_device(dev, dout);
  auto dqkv = to_device(dev, dqkv0);
  Outputs o;
  if (bf16_activations) {
    auto in = to_device(dev, qkv);
    auto out = to_device(dev, std::vector<bf16>(n, to_bf16(7.0f)));
    a.forward(out.data(), saved.data(), scratch.data(), in.data(), s);
    a.backward(dqkv.data(), scratch.data(), g.data(), in.data(), out.data(), saved.data(), s);
    o.out = to_floats(to_host(dev, out));
  } else {
    auto in = to_device(dev, to_floats(qkv));
    auto out = to_device(dev, std::vector<float>(n, 7.0f));
    a.forward(out.data(), saved.data(), scratch.data(), in.data(), s);
    a.backward(dqkv.data(), scratch.data(), g.data(), in.data(), out.data(), saved.data(), s);
    o.out = to_host(dev, out);
  }
  o.dqkv = to_host(dev, dqkv);
  o.saved = to_host(dev, saved);
  return o;
}

struct Inputs {
  std::vector<bf16> qkv;
  std::vector<float> dout, dqkv0;
};
Inputs inputs(const AttentionShape& s) {
  const std::size_t n = std::size_t(s.B) * s.T * s.C;
  return {rounded(randn(3 * n, 71)), randn(n, 72), randn(3 * n, 73)};
}

TEST(CudnnAttention, RequiredRunsCudnnWithinTheBf16BoundsDeterministically) {
  ComputeBackend b = make_cuda_backend(0, AttentionChoice::cudnn);
  EXPECT_NE(b.ops->describe().find("attention: cuDNN "), std::string::npos) << b.ops->describe();
  // Heads of 32 (several, odd B and T), 128 (the backward's largest), 8.
  for (const AttentionShape s : {AttentionShape{3, 45, 160, 5, true}, AttentionShape{1, 13, 128, 1, true},
                                 AttentionShape{2, 7, 24, 3, true}}) {
    SCOPED_TRACE("C " + std::to_string(s.C) + " NH " + std::to_string(s.NH));
    EXPECT_EQ(b.ops->attention().saved_floats(s), Index(s.B) * s.NH * s.T);
    const Inputs in = inputs(s);
    const Outputs first = run(b, s, in.qkv, in.dout, in.dqkv0, true);
    const Outputs second = run(b, s, in.qkv, in.dout, in.dqkv0, true);
    EXPECT_TRUE(same_bits(first.out, second.out));
    EXPECT_TRUE(same_bits(first.dqkv, second.dqkv)) << "the backward is not deterministic";
    EXPECT_TRUE(same_bits(first.saved, second.saved));
    const std::size_t n = std::size_t(s.B) * s.T * s.C, att = std::size_t(s.B) * s.NH * s.T * s.T;
    const Vec q = widen(in.qkv), gd = widen(in.dout);
    Vec out(n), preatt(att), probs(att), dpreatt(att), datt(att), dqkv = widen(in.dqkv0);
    attention_forward(host(), out.data(), preatt.data(), probs.data(), q.data(), s.B, s.T, s.C, s.NH);
    attention_backward(host(), dqkv.data(), dpreatt.data(), datt.data(), gd.data(), q.data(),
                       probs.data(), s.B, s.T, s.C, s.NH);
    Vec bound(n);
    for (std::size_t i = 0; i < n; ++i)
      bound[i] = std::ldexp(1.0, -8) * std::abs(out[i]) + kForward * std::max(1.0, std::abs(out[i]));
    expect_within("out", first.out, out, bound);
    expect_close("dqkv", first.dqkv, dqkv, kBackward);
  }
}

TEST(CudnnAttention, RequiredRefusesAShapeCudnnDoesNotTake) {
  ComputeBackend b = make_cuda_backend(0, AttentionChoice::cudnn);
  const AttentionShape heads_of_4{2, 5, 8, 2, true};
  try {
    (void)b.ops->attention().saved_floats(heads_of_4);
    FAIL() << "heads of 4 channels were not refused";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("compute.attention = \"cudnn\""), std::string::npos) << what;
    EXPECT_NE(what.find("CUDNN_STATUS_NOT_SUPPORTED_SHAPE"), std::string::npos) << what;
  }
}

// "auto" runs pdtrain's kernel where cuDNN cannot: the same bits as the pdtrain family.
TEST(CudnnAttention, AutoFallsBackOnPdtrainsKernelBitForBit) {
  ComputeBackend automatic = make_cuda_backend(0, AttentionChoice::automatic);
  ComputeBackend own = make_cuda_backend(0, AttentionChoice::pdtrain);
  struct Case {
    AttentionShape s;
    bool bf16_activations;
  };
  // Heads of 4 (cuDNN refuses), and an fp32 run (cuDNN's attention is 16-bit only).
  for (const Case c : {Case{{2, 5, 8, 2, true}, true}, Case{{2, 7, 24, 3, false}, false}}) {
    const Inputs in = inputs(c.s);
    EXPECT_EQ(automatic.ops->attention().saved_floats(c.s), own.ops->attention().saved_floats(c.s));
    const Outputs a = run(automatic, c.s, in.qkv, in.dout, in.dqkv0, c.bf16_activations);
    const Outputs p = run(own, c.s, in.qkv, in.dout, in.dqkv0, c.bf16_activations);
    EXPECT_TRUE(same_bits(a.out, p.out));
    EXPECT_TRUE(same_bits(a.dqkv, p.dqkv));
    EXPECT_TRUE(same_bits(a.saved, p.saved));
  }
}

}  // namespace
}  // namespace pdtrain::kernels::testing
