// The assembled model: its analytic gradient (all kernels wired together, tied embedding,
// residual stream) against finite differences of its loss, and a loss of ln(V) at init.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <utility>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/kernels/backend_registry.hpp"
#include "pdtrain/model/gpt_stage.hpp"

namespace pdtrain {
namespace {

struct Tiny {
  ModelShape shape;
  ParamCatalog cat;
  StageParams params;
  std::vector<std::int32_t> tokens, targets;
  static ModelShape make_shape() {
    return resolve_model_shape(
        {.n_layer = 2, .n_head = 2, .d_model = 8, .vocab_size = 11, .seq_len = 5});
  }
  Tiny()
      : shape(make_shape()), cat(shape), params(cat, StageSpec{0, 2, true, true, 1, 0}) {
    for (int id : params.needed_blocks()) {
      const BlockInfo& b = cat.block(id);
      std::vector<float> packed(static_cast<std::size_t>(b.numel()));
      cat.init_block(b, 0.3, 5, packed.data());  // large init: gradients well above float noise
      // LayerNorm weights and biases perturbed away from 1 / 0 so their gradients are generic.
      for (std::size_t i = 0; i < packed.size(); ++i)
        if (!cat.tensor(b.tensor).weight_decay)
          packed[i] += static_cast<float>(0.2 * rng_normal(rng_key(9, id), i));
      params.unpack_param(b, packed.data());
    }
    const std::int64_t B = 2, T = shape.seq_len;
    for (std::int64_t i = 0; i < B * T; ++i) {
      tokens.push_back(static_cast<std::int32_t>(rng_below(rng_key(1), i, 11)));
      targets.push_back(static_cast<std::int32_t>(rng_below(rng_key(2), i, 11)));
    }
  }
};

TEST(GptStage, InitialLossIsAboutLogVocab) {
  Tiny t;
  // Re-initialize with the usual small std: logits near zero, loss near ln(V).
  for (int id : t.params.needed_blocks()) {
    const BlockInfo& b = t.cat.block(id);
    std::vector<float> packed(static_cast<std::size_t>(b.numel()));
    t.cat.init_block(b, 0.02, 5, packed.data());
    t.params.unpack_param(b, packed.data());
  }
  NoTensorParallel tp;
  GptStage stage(t.params, 2, t.shape.seq_len, tp);
  stage.forward(0, t.tokens.data(), nullptr, t.targets.data());
  const double loss = stage.take_loss_sum() / 10.0;
  EXPECT_NEAR(loss, std::log(11.0), 0.1);
}

// What a parameter cache and a gradient streamer are told: every use the traversals announce,
// in order, and the lists they plan from (the program's) must agree.
struct UseRecorder final : UnitUser, GradUser {
  std::vector<std::vector<int>> needs, grad_sections;
  void need(const std::vector<int>& units) override { needs.push_back(units); }
  void grads_begin(const std::vector<int>& units) override { grad_sections.push_back(units); }
  void grads_end(const std::vector<int>& units) override {
    ASSERT_FALSE(grad_sections.empty());
    EXPECT_EQ(grad_sections.back(), units) << "a section ends other units than it began";
  }
};

TEST(GptStage, TraversalsAnnounceTheProgramsUses) {
  Tiny t;
  UseRecorder uses;
  t.params.set_unit_user(&uses);
  t.params.set_grad_user(&uses);
  NoTensorParallel tp;
  GptStage stage(t.params, 2, t.shape.seq_len, tp);
  stage.forward(0, t.tokens.data(), nullptr, t.targets.data());
  EXPECT_EQ(uses.needs, stage.program().forward_uses());
  uses.needs.clear();
  stage.backward(0, 0.1f, nullptr);
  EXPECT_EQ(uses.needs, stage.program().backward_uses());
  EXPECT_EQ(uses.grad_sections, stage.program().backward_grad_uses());
  t.params.set_unit_user(nullptr);
  t.params.set_grad_user(nullptr);
  // The embedding, each layer, the head; backward reads no parameters for the embedding.
  const StageParams& p = t.params;
  EXPECT_EQ(stage.program().forward_uses(),
            (std::vector<std::vector<int>>{{p.wte_unit(), p.wpe_unit()}, {0}, {1},
                                           {p.lnf_unit(), p.wte_unit()}}));
  EXPECT_EQ(stage.program().backward_uses(),
            (std::vector<std::vector<int>>{{p.lnf_unit(), p.wte_unit()}, {1}, {0}}));
}

TEST(GptStage, GradientMatchesFiniteDifferencesOfTheLoss) {
  Tiny t;
  NoTensorParallel tp;
  GptStage stage(t.params, 2, t.shape.seq_len, tp);
  const float dloss = 1.0f / 10.0f;
  auto loss = [&] {
    t.params.upload_params();
    stage.forward(0, t.tokens.data(), nullptr, t.targets.data());
    return stage.take_loss_sum() * dloss;
  };
  t.params.zero_grads();
  loss();
  stage.backward(0, dloss, nullptr);
  t.params.download_grads();
  const std::vector<float> grad(t.params.grads_host(), t.params.grads_host() + t.params.numel());
  // Check the 200 largest gradient entries (spread over every tensor) and 100 random ones.
  std::vector<std::int64_t> idx(grad.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + 200, idx.end(),
                    [&](auto a, auto b) { return std::abs(grad[a]) > std::abs(grad[b]); });
  idx.resize(200);
  for (int i = 0; i < 100; ++i)
    idx.push_back(static_cast<std::int64_t>(rng_below(rng_key(3), i, grad.size())));
  const float h = 1e-2f;
  int checked = 0;
  for (std::int64_t i : idx) {
    float& p = t.params.params_host()[i];
    const float keep = p;
    p = keep + h;
    const double up = loss();
    p = keep - h;
    const double down = loss();
    p = keep;
    const double fd = (up - down) / (2.0 * h);
    // float forward + O(h^2) truncation: absolute 2e-4 plus 2 % relative.
    EXPECT_NEAR(grad[i], fd, 2e-4 + 0.02 * std::abs(fd)) << "parameter " << i;
    ++checked;
  }
  EXPECT_EQ(checked, 300);
  // The tied embedding gets gradient from both the lookup and the head.
  const TensorInfo& wte = t.cat.tensor(TensorId::wte);
  double wte_norm = 0;
  for (std::int64_t i = 0; i < 11 * 8; ++i) wte_norm += std::abs(grad[wte.offset + i]);
  EXPECT_GT(wte_norm, 0.0);
}

}  // namespace
}  // namespace pdtrain

namespace pdtrain {
namespace {

// Recomputing activations in backward (attention probabilities, or whole layers) gives the same
// loss and the same gradients, bit for bit, as keeping them.
TEST(GptStage, RecomputationGivesIdenticalLossAndGradients) {
  auto run = [](Recompute mode) {
    Tiny t;
    NoTensorParallel tp;
    GptStage stage(t.params, 2, t.shape.seq_len, tp, 1, mode);
    t.params.zero_grads();
    stage.forward(0, t.tokens.data(), nullptr, t.targets.data());
    const double loss = stage.take_loss_sum();
    stage.backward(0, 0.1f, nullptr);
    t.params.download_grads();
    const float* g = t.params.grads_host();
    return std::make_pair(loss, std::vector<float>(g, g + t.params.numel()));
  };
  const auto none = run(Recompute::none);
  for (Recompute mode : {Recompute::attention, Recompute::full}) {
    const auto r = run(mode);
    EXPECT_EQ(r.first, none.first);
    EXPECT_EQ(r.second, none.second);
  }
}

}  // namespace
}  // namespace pdtrain

namespace pdtrain {
namespace {

// An attention family of another layout behind the same model code: the CPU reference with
// more saved floats and scratch than it needs. Forward stamps the extra saved floats with a
// number of its own and remembers which qkv it saved for; backward checks that it gets the
// saved floats of the forward of the same qkv, stamp intact (another buffer or an overlap
// would break it), and writes the last of its scratch (a short buffer fails under ASan).
class PaddedAttention final : public kernels::AttentionOps {
 public:
  static constexpr kernels::Index kExtraSaved = 3, kExtraScratch = 5;
  std::string describe() const override { return "padded reference"; }
  kernels::Index saved_floats(const kernels::AttentionShape& s) const override {
    return ref().saved_floats(s) + kExtraSaved;
  }
  kernels::Index scratch_floats(const kernels::AttentionShape& s) const override {
    return ref().scratch_floats(s) + kExtraScratch;
  }
  void forward(float* out, float* saved, float* scratch, const float* qkv,
               const kernels::AttentionShape& s) override {
    forward_as(out, saved, scratch, qkv, s);
  }
  void forward(bf16* out, float* saved, float* scratch, const bf16* qkv,
               const kernels::AttentionShape& s) override {
    forward_as(out, saved, scratch, qkv, s);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                const float* out, const float* saved, const kernels::AttentionShape& s) override {
    backward_as(dqkv, scratch, dout, qkv, out, saved, s);
  }
  void backward(float* dqkv, float* scratch, const float* dout, const bf16* qkv, const bf16* out,
                const float* saved, const kernels::AttentionShape& s) override {
    backward_as(dqkv, scratch, dout, qkv, out, saved, s);
  }
  int forwards = 0, backwards = 0;

 private:
  // Either activation type (A: float or bf16), the same checks.
  template <class A>
  void forward_as(A* out, float* saved, float* scratch, const A* qkv,
                  const kernels::AttentionShape& s) {
    ref().forward(out, saved, scratch, qkv, s);
    scratch[scratch_floats(s) - 1] = 1.0f;
    const float stamp = static_cast<float>(++forwards);
    std::fill_n(saved + ref().saved_floats(s), kExtraSaved, stamp);
    saved_for[saved] = {qkv, stamp};
  }
  template <class A>
  void backward_as(float* dqkv, float* scratch, const float* dout, const A* qkv, const A* out,
                   const float* saved, const kernels::AttentionShape& s) {
    const auto it = saved_for.find(saved);
    ASSERT_NE(it, saved_for.end()) << "backward got saved floats no forward wrote";
    EXPECT_EQ(it->second.first, static_cast<const void*>(qkv))
        << "backward got the saved floats of another forward";
    for (kernels::Index i = 0; i < kExtraSaved; ++i)
      EXPECT_EQ(saved[ref().saved_floats(s) + i], it->second.second) << "saved floats overwritten";
    scratch[scratch_floats(s) - 1] = 2.0f;
    ref().backward(dqkv, scratch, dout, qkv, out, saved, s);
    ++backwards;
  }
  static kernels::AttentionOps& ref() { return kernels::cpu_kernel_ops().attention(); }
  std::map<const float*, std::pair<const void*, float>> saved_for;
};

// The model sizes the attention's buffers by the family's answers and hands them over as the
// interface says: a replaced family of another layout gives the reference's loss and gradients
// bit for bit, in every recomputation mode, and memory_bytes counts its buffers.
TEST(GptStage, AReplacedAttentionGetsTheBuffersItAsksFor) {
  auto run = [](Recompute mode, kernels::KernelOps& ops) {
    Tiny t;
    NoTensorParallel tp;
    GptStage stage(t.params, 2, t.shape.seq_len, tp, 1, mode, ops);
    t.params.zero_grads();
    stage.forward(0, t.tokens.data(), nullptr, t.targets.data());
    const double loss = stage.take_loss_sum();
    stage.backward(0, 0.1f, nullptr);
    t.params.download_grads();
    const float* g = t.params.grads_host();
    return std::make_pair(loss, std::vector<float>(g, g + t.params.numel()));
  };
  for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::full}) {
    kernels::ComputeBackend cpu = kernels::make_backend("cpu");
    auto padded = std::make_unique<PaddedAttention>();
    PaddedAttention& attention = *padded;
    cpu.ops->replace_attention(std::move(padded));
    const auto reference = run(mode, kernels::cpu_kernel_ops());
    const auto got = run(mode, *cpu.ops);
    EXPECT_EQ(got.first, reference.first);
    EXPECT_EQ(got.second, reference.second);
    EXPECT_EQ(attention.backwards, 2);  // one per layer
    EXPECT_EQ(attention.forwards, mode == Recompute::none ? 2 : 4);
  }
  const ModelShape shape = Tiny::make_shape();
  const StageSpec whole{0, 2, true, true, 1, 0};
  PaddedAttention padded;
  const auto extra = [&](Recompute mode) {
    return GptStage::memory_bytes(shape, whole, 2, shape.seq_len, 1, mode, Precision::fp32,
                                  StageOrder::micro_batch, padded) -
           GptStage::memory_bytes(shape, whole, 2, shape.seq_len, 1, mode);
  };
  // Bytes: saved floats per kept layer (none: both; attention: one recomputed copy; full: the
  // one recomputed layer's) and one scratch.
  const std::int64_t saved = PaddedAttention::kExtraSaved * 4,
                     scratch = PaddedAttention::kExtraScratch * 4;
  EXPECT_EQ(extra(Recompute::none), 2 * saved + scratch);
  EXPECT_EQ(extra(Recompute::attention), saved + scratch);
  EXPECT_EQ(extra(Recompute::full), saved + scratch);
}

// A GPU's bf16 run keeps qkv and the MLP's pre-activation in bf16 instead of fp32, no fp32
// attention output beside its bf16 copy, and the MLP's hidden gradient in bf16
// (Bf16Activations::gemm_io); an fp32 run is laid out alike under either.
TEST(GptStage, Bf16ActivationsOnAGpuKeepHalfTheGemmOutputs) {
  const ModelShape shape = Tiny::make_shape();
  const StageSpec whole{0, 2, true, true, 1, 0};
  const std::int64_t B = 2, N = B * shape.seq_len, C = shape.d_model, layers = 2;
  using kernels::Bf16Activations;
  const auto bytes = [&](Precision precision, Bf16Activations bf16, Recompute mode) {
    return GptStage::memory_bytes(shape, whole, B, shape.seq_len, 1, mode, precision,
                                  StageOrder::micro_batch, kernels::cpu_attention(),
                                  {kernels::LogitsRows::dense, bf16});
  };
  for (Recompute mode : {Recompute::none, Recompute::attention}) {
    const std::int64_t saved = bytes(Precision::bf16, Bf16Activations::matmul_inputs, mode) -
                               bytes(Precision::bf16, Bf16Activations::gemm_io, mode);
    // Per layer: qkv 3C and fch 4C from 4 to 2 bytes, atty's 4 bytes of fp32 gone; the hidden
    // gradient 4C from 4 to 2 bytes; attention recompute: its scratch output from 4 to 2 bytes;
    // the classifier's logits (dense rows of the vocabulary) from 4 to 2 bytes, its row
    // statistics one float more per row (the shard's own max, for the tp rescale).
    const std::int64_t scratch = mode == Recompute::attention ? N * C * 2 : 0;
    const std::int64_t logits = N * shape.vocab_size * 2 - N * 4;  // the shard's real rows
    EXPECT_EQ(saved, layers * N * C * (3 * 2 + 4 + 4 * 2) + N * 4 * C * 2 + scratch + logits);
    EXPECT_EQ(bytes(Precision::fp32, Bf16Activations::matmul_inputs, mode),
              bytes(Precision::fp32, Bf16Activations::gemm_io, mode));
  }
}

}  // namespace
}  // namespace pdtrain
