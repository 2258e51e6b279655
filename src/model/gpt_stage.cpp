#include "pdtrain/model/gpt_stage.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>

#include "pdtrain/kernels/gpt_kernels.hpp"

namespace pdtrain {

namespace k = kernels;
using Exec = Kokkos::DefaultExecutionSpace;
using T_ = TensorId;

namespace {
template <class V>
void resize(V& v, std::int64_t n) {
  v.assign(static_cast<std::size_t>(n), typename V::value_type{});
}
}  // namespace

GptStage::GptStage(StageParams& params, std::int64_t micro_batch, std::int64_t seq_len,
                   TensorParallelOps& tp, int slots, Recompute recompute)
    : p_(params), tp_(tp), B_(micro_batch), T_(seq_len), recompute_(recompute),
      bf16_(params.bf16()) {
  const ModelShape& m = params.catalog().shape();
  const StageSpec& s = params.spec();
  C_ = m.d_model;
  NHl_ = m.n_head / s.tp_size;
  Cl_ = NHl_ * m.head_size();
  // This rank's vocabulary shard: wte rows [v0_, v1_), of which the first V_ are real tokens
  // (the rest are padding rows; a shard may hold padding only, V_ = 0).
  v0_ = params.vocab_begin();
  v1_ = params.vocab_end();
  V_ = std::max<std::int64_t>(0, std::min(v1_, m.vocab_size) - v0_);
  layers_ = s.layer_end - s.layer_begin;
  const std::int64_t N = B_ * T_, att = B_ * NHl_ * T_ * T_;
  slot_.resize(static_cast<std::size_t>(slots));
  for (SlotActs& a : slot_) {
    resize(a.tokens, N);
    resize(a.targets, N);
    resize(a.input, N * C_);
    a.layers.resize(static_cast<std::size_t>(layers_));
    for (LayerActs& l : a.layers) {
      if (recompute_ == Recompute::full)
        resize(l.residual3, N * C_);  // the next layer's input; the rest is recomputed
      else
        allocate(l, recompute_ == Recompute::none);
    }
    if (s.has_head) {
      if (bf16_)
        resize(a.lnf_h, N * C_);
      else
        resize(a.lnf, N * C_);
      resize(a.lnf_mean, N), resize(a.lnf_rstd, N);
      resize(a.logits, N * V_), resize(a.probs, N * V_), resize(a.losses, N);
      resize(a.rowmax, N), resize(a.ce_stats, 2 * N);
    }
  }
  resize(preatt_, att);
  if (recompute_ == Recompute::full) allocate(scratch_, true);
  if (recompute_ == Recompute::attention) resize(att_scratch_, att), resize(atty_scratch_, N * Cl_);
  resize(g_.dresidual, N * C_), resize(g_.dln, N * C_), resize(g_.dqkv, N * 3 * Cl_);
  resize(g_.datty, N * Cl_), resize(g_.dpreatt, att), resize(g_.datt, att);
  resize(g_.dfch, N * 4 * Cl_), resize(g_.dfch_gelu, N * 4 * Cl_);
  if (s.has_head) resize(g_.dlogits, N * V_), resize(g_.dlosses, N);
  if (bf16_) resize(g_.dout_h, N * std::max({4 * Cl_, C_, s.has_head ? V_ : 0}));
}

void GptStage::allocate(LayerActs& l, bool keep_att) {
  const std::int64_t N = B_ * T_;
  if (bf16_) {
    resize(l.ln1_h, N * C_), resize(l.atty_h, N * Cl_), resize(l.ln2_h, N * C_);
    resize(l.fch_gelu_h, N * 4 * Cl_);
  } else {
    resize(l.ln1, N * C_), resize(l.ln2, N * C_), resize(l.fch_gelu, N * 4 * Cl_);
  }
  resize(l.ln1_mean, N), resize(l.ln1_rstd, N);
  resize(l.qkv, N * 3 * Cl_), resize(l.atty, N * Cl_);
  if (keep_att) resize(l.att, B_ * NHl_ * T_ * T_);
  resize(l.attproj, N * C_), resize(l.residual2, N * C_);
  resize(l.ln2_mean, N), resize(l.ln2_rstd, N);
  resize(l.fch, N * 4 * Cl_);
  resize(l.fcproj, N * C_), resize(l.residual3, N * C_);
}

void GptStage::linear_forward(float* out, const float* x, const bf16* x_h, TensorId w,
                              std::int64_t l, const float* bias, std::int64_t C,
                              std::int64_t OC) {
  Exec exec;
  const int N = static_cast<int>(B_ * T_);
  if (bf16_)
    k::matmul_forward(exec, out, x_h, p_.param_bf16(w, l), bias, N, static_cast<int>(C),
                      static_cast<int>(OC));
  else
    k::matmul_forward(exec, out, x, p_.param(w, l), bias, N, static_cast<int>(C),
                      static_cast<int>(OC));
}

void GptStage::linear_backward(float* dx, float* dweight, float* dbias, const float* dout,
                               const float* x, const bf16* x_h, TensorId w, std::int64_t l,
                               std::int64_t C, std::int64_t OC) {
  Exec exec;
  const int N = static_cast<int>(B_ * T_);
  if (bf16_)
    k::matmul_backward(exec, dx, dweight, dbias, dout, g_.dout_h.data(), x_h,
                       p_.param_bf16(w, l), N, static_cast<int>(C), static_cast<int>(OC));
  else
    k::matmul_backward(exec, dx, dweight, dbias, dout, x, p_.param(w, l), N,
                       static_cast<int>(C), static_cast<int>(OC));
}

std::int64_t GptStage::memory_bytes(const ModelShape& m, const StageSpec& s,
                                    std::int64_t micro_batch, std::int64_t seq_len, int slots) {
  const std::int64_t N = micro_batch * seq_len, C = m.d_model, NHl = m.n_head / s.tp_size;
  const std::int64_t Cl = NHl * m.head_size(), att = micro_batch * NHl * seq_len * seq_len;
  const std::int64_t v0 = s.tp_rank * m.n_head / s.tp_size * m.padded_vocab / m.n_head;
  const std::int64_t v1 = (s.tp_rank + 1) * m.n_head / s.tp_size * m.padded_vocab / m.n_head;
  const std::int64_t V = std::max<std::int64_t>(0, std::min(v1, m.vocab_size) - v0);
  const std::int64_t per_layer = 6 * N * C + 4 * N + 9 * N * Cl + att;
  std::int64_t per_slot = N * C + (s.layer_end - s.layer_begin) * per_layer;
  if (s.has_head) per_slot += N * C + 2 * N * V + 6 * N;
  const std::int64_t scratch =
      2 * N * C + 12 * N * Cl + 3 * att + (s.has_head ? N * V + N : 0);
  return 4 * (slots * per_slot + scratch);
}

const float* GptStage::output(int slot) const {
  const SlotActs& a = slot_[slot];
  return layers_ > 0 ? a.layers.back().residual3.data() : a.input.data();
}

// The parameter units forward() and backward() announce with need(), in order: a parameter
// cache plans its prefetches and evictions from these lists, and need() checks each use
// against the plan.
std::vector<std::vector<int>> GptStage::forward_uses(const StageParams& p) {
  std::vector<std::vector<int>> uses;
  const std::int64_t layers = p.spec().layer_end - p.spec().layer_begin;
  if (p.spec().has_embedding) uses.push_back({p.wte_unit(), p.wpe_unit()});
  for (std::int64_t i = 0; i < layers; ++i) uses.push_back({static_cast<int>(i)});
  if (p.spec().has_head) uses.push_back({p.lnf_unit(), p.wte_unit()});
  return uses;
}

std::vector<std::vector<int>> GptStage::backward_uses(const StageParams& p) {
  std::vector<std::vector<int>> uses;
  const std::int64_t layers = p.spec().layer_end - p.spec().layer_begin;
  if (p.spec().has_head) uses.push_back({p.lnf_unit(), p.wte_unit()});
  for (std::int64_t i = layers - 1; i >= 0; --i) uses.push_back({static_cast<int>(i)});
  return uses;  // the embedding's backward needs no parameters
}

double GptStage::forward(int slot, const std::int32_t* tokens, const float* input,
                         const std::int32_t* targets) {
  SlotActs& a = slot_[slot];
  const std::int64_t N = B_ * T_;
  Exec exec;
  if (p_.spec().has_embedding) {
    p_.need({p_.wte_unit(), p_.wpe_unit()});
    // Vocabulary-parallel lookup: each shard embeds its own tokens (0 elsewhere), one shard adds
    // the positions, and the sum over the group is the full embedding.
    std::copy_n(tokens, N, a.tokens.begin());
    const float* wpe = tp_.rank() == 0 ? p_.param(T_::wpe) : nullptr;
    k::encoder_forward(exec, a.input.data(), a.tokens.data(), p_.param(T_::wte), wpe, B_, T_, C_,
                       static_cast<int>(v0_), static_cast<int>(v1_));
    exec.fence();
    tp_.allreduce_sum(a.input.data(), N * C_);
  } else {
    std::copy_n(input, N * C_, a.input.begin());
  }
  const float* residual = a.input.data();
  for (std::int64_t i = 0; i < layers_; ++i) {
    LayerActs& kept = a.layers[i];
    p_.need({static_cast<int>(i)});
    if (recompute_ == Recompute::full) {
      layer_forward(p_.spec().layer_begin + i, residual, scratch_);
      exec.fence();
      std::copy(scratch_.residual3.begin(), scratch_.residual3.end(), kept.residual3.begin());
    } else {
      layer_forward(p_.spec().layer_begin + i, residual, kept);
    }
    residual = kept.residual3.data();
  }
  if (!p_.spec().has_head) {
    exec.fence();
    return 0.0;
  }
  std::copy_n(targets, N, a.targets.begin());
  p_.need({p_.lnf_unit(), p_.wte_unit()});
  head_forward(a, residual);
  exec.fence();  // losses are read on the host
  double sum = 0.0;
  for (float l : a.losses) sum += l;
  return sum;
}

void GptStage::layer_forward(std::int64_t l, const float* residual, LayerActs& a) {
  const std::int64_t N = B_ * T_;
  Exec exec;
  // In bf16 precision LayerNorm and GELU write their (matmul input) outputs as bf16 directly.
  if (bf16_)
    k::layernorm_forward(exec, a.ln1_h.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                         p_.param(T_::ln1w, l), p_.param(T_::ln1b, l), N, C_);
  else
    k::layernorm_forward(exec, a.ln1.data(), a.ln1_mean.data(), a.ln1_rstd.data(), residual,
                         p_.param(T_::ln1w, l), p_.param(T_::ln1b, l), N, C_);
  linear_forward(a.qkv.data(), a.ln1.data(), a.ln1_h.data(), T_::qkvw, l, p_.param(T_::qkvb, l),
                 C_, 3 * Cl_);
  k::attention_forward(exec, a.atty.data(), preatt_.data(), att_of(a), a.qkv.data(), B_, T_,
                       Cl_, NHl_);
  if (bf16_) {
    exec.fence();
    k::to_bf16(a.atty.data(), a.atty_h.data(), N * Cl_);
  }
  // Row-parallel projection: partial sums over this shard's heads, summed across the tp group.
  // Its bias is added once, after the sum.
  linear_forward(a.attproj.data(), a.atty.data(), a.atty_h.data(), T_::attprojw, l, nullptr, Cl_,
                 C_);
  exec.fence();
  tp_.allreduce_sum(a.attproj.data(), N * C_);
  k::bias_add_forward(exec, a.attproj.data(), p_.param(T_::attprojb, l), N, C_);
  k::residual_forward(exec, a.residual2.data(), residual, a.attproj.data(), N * C_);
  if (bf16_)
    k::layernorm_forward(exec, a.ln2_h.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                         a.residual2.data(), p_.param(T_::ln2w, l), p_.param(T_::ln2b, l), N, C_);
  else
    k::layernorm_forward(exec, a.ln2.data(), a.ln2_mean.data(), a.ln2_rstd.data(),
                         a.residual2.data(), p_.param(T_::ln2w, l), p_.param(T_::ln2b, l), N, C_);
  linear_forward(a.fch.data(), a.ln2.data(), a.ln2_h.data(), T_::fcw, l, p_.param(T_::fcb, l), C_,
                 4 * Cl_);
  if (bf16_)
    k::gelu_forward(exec, a.fch_gelu_h.data(), a.fch.data(), N * 4 * Cl_);
  else
    k::gelu_forward(exec, a.fch_gelu.data(), a.fch.data(), N * 4 * Cl_);
  linear_forward(a.fcproj.data(), a.fch_gelu.data(), a.fch_gelu_h.data(), T_::fcprojw, l, nullptr,
                 4 * Cl_, C_);
  exec.fence();
  tp_.allreduce_sum(a.fcproj.data(), N * C_);
  k::bias_add_forward(exec, a.fcproj.data(), p_.param(T_::fcprojb, l), N, C_);
  k::residual_forward(exec, a.residual3.data(), a.residual2.data(), a.fcproj.data(), N * C_);
}

void GptStage::head_forward(SlotActs& s, const float* residual) {
  const std::int64_t N = B_ * T_;
  Exec exec;
  if (bf16_)
    k::layernorm_forward(exec, s.lnf_h.data(), s.lnf_mean.data(), s.lnf_rstd.data(), residual,
                         p_.param(T_::lnfw), p_.param(T_::lnfb), N, C_);
  else
    k::layernorm_forward(exec, s.lnf.data(), s.lnf_mean.data(), s.lnf_rstd.data(), residual,
                         p_.param(T_::lnfw), p_.param(T_::lnfb), N, C_);
  // Tied head over this rank's vocabulary shard, real tokens only: padded wte rows never enter
  // (llm.c masks them out of the softmax; skipping them is the same and cheaper).
  if (V_ > 0)
    linear_forward(s.logits.data(), s.lnf.data(), s.lnf_h.data(), T_::wte, 0, nullptr, C_, V_);
  // Parallel cross-entropy: only per-row statistics cross the group, never logits.
  k::crossentropy_rowmax(exec, s.rowmax.data(), s.logits.data(), N, V_);
  exec.fence();
  tp_.allreduce_max(s.rowmax.data(), N);
  k::crossentropy_partials(exec, s.ce_stats.data(), s.probs.data(), s.logits.data(),
                           s.rowmax.data(), s.targets.data(), static_cast<int>(v0_), N, V_);
  exec.fence();
  tp_.allreduce_sum(s.ce_stats.data(), 2 * N);
  k::crossentropy_finish(exec, s.losses.data(), s.probs.data(), s.ce_stats.data(), N, V_);
}

void GptStage::backward(int slot, float dloss, const float* doutput) {
  SlotActs& a = slot_[slot];
  const std::int64_t N = B_ * T_;
  Exec exec;
  const float* last = layers_ > 0 ? a.layers.back().residual3.data() : a.input.data();
  if (p_.spec().has_head) {
    p_.need({p_.lnf_unit(), p_.wte_unit()});
    head_backward(a, last, dloss);  // leaves d(last residual) in g_.dresidual
  } else {
    std::copy_n(doutput, N * C_, g_.dresidual.begin());
  }
  for (std::int64_t i = layers_ - 1; i >= 0; --i) {
    const float* residual = i > 0 ? a.layers[i - 1].residual3.data() : a.input.data();
    const std::int64_t l = p_.spec().layer_begin + i;
    p_.need({static_cast<int>(i)});
    if (recompute_ == Recompute::full) {
      layer_forward(l, residual, scratch_);  // the same inputs, the same bits
      layer_backward(l, residual, scratch_);
    } else {
      layer_backward(l, residual, a.layers[i]);
    }
  }
  if (p_.spec().has_embedding)
    k::encoder_backward(exec, p_.grad(T_::wte), p_.grad(T_::wpe), g_.dresidual.data(),
                        a.tokens.data(), B_, T_, C_, static_cast<int>(v0_),
                        static_cast<int>(v1_));
  exec.fence();  // gradients are packed on the host
}

void GptStage::head_backward(SlotActs& s, const float* residual, float dloss) {
  const std::int64_t N = B_ * T_;
  Exec exec;
  std::fill(g_.dlosses.begin(), g_.dlosses.end(), dloss);
  std::fill(g_.dlogits.begin(), g_.dlogits.end(), 0.0f);
  k::softmax_crossentropy_backward(exec, g_.dlogits.data(), s.probs.data(), s.targets.data(),
                                   g_.dlosses.data(), N, V_, static_cast<int>(v0_));
  std::fill(g_.dln.begin(), g_.dln.end(), 0.0f);
  if (V_ > 0)
    linear_backward(g_.dln.data(), p_.grad(T_::wte), nullptr, g_.dlogits.data(), s.lnf.data(),
                    s.lnf_h.data(), T_::wte, 0, C_, V_);
  exec.fence();
  tp_.allreduce_sum(g_.dln.data(), N * C_);  // partial over the vocabulary shards
  std::fill(g_.dresidual.begin(), g_.dresidual.end(), 0.0f);
  k::layernorm_backward(exec, g_.dresidual.data(), p_.grad(T_::lnfw), p_.grad(T_::lnfb),
                        g_.dln.data(), residual, p_.param(T_::lnfw), s.lnf_mean.data(),
                        s.lnf_rstd.data(), N, C_);
}

// On entry g_.dresidual holds d(residual3); on exit d(layer input). llm.c's trick: the residual
// gradient flows through unchanged and each LayerNorm backward adds its branch into it.
void GptStage::layer_backward(std::int64_t l, const float* residual, LayerActs& a) {
  const std::int64_t N = B_ * T_;
  Exec exec;
  auto zero = [](std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); };
  zero(g_.dfch_gelu);
  linear_backward(g_.dfch_gelu.data(), p_.grad(T_::fcprojw, l), p_.grad(T_::fcprojb, l),
                  g_.dresidual.data(), a.fch_gelu.data(), a.fch_gelu_h.data(), T_::fcprojw, l,
                  4 * Cl_, C_);
  zero(g_.dfch);
  k::gelu_backward(exec, g_.dfch.data(), a.fch.data(), g_.dfch_gelu.data(), N * 4 * Cl_);
  zero(g_.dln);
  linear_backward(g_.dln.data(), p_.grad(T_::fcw, l), p_.grad(T_::fcb, l), g_.dfch.data(),
                  a.ln2.data(), a.ln2_h.data(), T_::fcw, l, C_, 4 * Cl_);
  exec.fence();
  tp_.allreduce_sum(g_.dln.data(), N * C_);  // column-parallel input gradient
  k::layernorm_backward(exec, g_.dresidual.data(), p_.grad(T_::ln2w, l), p_.grad(T_::ln2b, l),
                        g_.dln.data(), a.residual2.data(), p_.param(T_::ln2w, l),
                        a.ln2_mean.data(), a.ln2_rstd.data(), N, C_);
  zero(g_.datty);
  linear_backward(g_.datty.data(), p_.grad(T_::attprojw, l), p_.grad(T_::attprojb, l),
                  g_.dresidual.data(), a.atty.data(), a.atty_h.data(), T_::attprojw, l, Cl_, C_);
  zero(g_.dqkv);
  zero(g_.dpreatt);
  zero(g_.datt);
  if (a.att.empty())  // recompute the attention probabilities this layer did not keep
    k::attention_forward(exec, atty_scratch_.data(), preatt_.data(), att_scratch_.data(),
                         a.qkv.data(), B_, T_, Cl_, NHl_);
  k::attention_backward(exec, g_.dqkv.data(), g_.dpreatt.data(), g_.datt.data(), g_.datty.data(),
                        a.qkv.data(), att_of(a), B_, T_, Cl_, NHl_);
  zero(g_.dln);
  linear_backward(g_.dln.data(), p_.grad(T_::qkvw, l), p_.grad(T_::qkvb, l), g_.dqkv.data(),
                  a.ln1.data(), a.ln1_h.data(), T_::qkvw, l, C_, 3 * Cl_);
  exec.fence();
  tp_.allreduce_sum(g_.dln.data(), N * C_);
  k::layernorm_backward(exec, g_.dresidual.data(), p_.grad(T_::ln1w, l), p_.grad(T_::ln1b, l),
                        g_.dln.data(), residual, p_.param(T_::ln1w, l), a.ln1_mean.data(),
                        a.ln1_rstd.data(), N, C_);
}

}  // namespace pdtrain
