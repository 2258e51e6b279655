#include "pdtrain/model/gpt_stage.hpp"

#include <algorithm>
#include <type_traits>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

using Tid = TensorId;

GptStage::GptStage(StageParams& params, std::int64_t micro_batch, std::int64_t seq_len,
                   TensorParallelOps& tp, int slots, Recompute recompute, kernels::KernelOps& ops,
                   StageOrder order)
    : p_(params), program_(params), tp_(tp), k_(ops), dev_(params.device()),
      dims_(dims_of(params.catalog().shape(), params.spec(), micro_batch, seq_len, slots,
                    recompute, params.bf16(), order, ops.attention(), ops.layout())) {
  PDT_CHECK(!dims_.layer_major || (dims_.embedding && dims_.head),
            "layer-major order needs the whole model on one stage");
  // This rank's vocabulary shard as StageParams places it (dims_of derives the same bounds
  // from the spec for memory_bytes; they must agree).
  PDT_CHECK(!(dims_.embedding || dims_.head) ||
                (dims_.v0 == params.vocab_begin() && dims_.v1 == params.vocab_end()),
            "vocabulary shard of the stage and of its parameters differ");
  const AllocationLabel label(dev_, activations_label(dims_, allocated_bytes(dims_)));
  allocate(dims_, acts_, [this](auto& buffer, std::int64_t n) {
    using Elem = std::remove_reference_t<decltype(*buffer.data())>;
    buffer = Buffer<Elem>(dev_, n);
  });
}

// What an out-of-memory error names while the stage allocates, with what would need less.
std::string GptStage::activations_label(const Dims& d, std::int64_t bytes) {
  return "the stage's activations and backward scratch (" + std::to_string(bytes) +
         " bytes in all: " + std::to_string(d.slots) + " micro-batch slot(s) of " +
         std::to_string(d.B) + " x " + std::to_string(d.T) + " tokens, " +
         std::to_string(d.layers) + " layer(s)" + (d.head ? " and the classifier" : "") +
         "; train.recompute or a smaller micro-batch needs less)";
}

GptStage::Dims GptStage::dims_of(const ModelShape& m, const StageSpec& s, std::int64_t micro_batch,
                                 std::int64_t seq_len, int slots, Recompute recompute, bool bf16,
                                 StageOrder order, const kernels::AttentionFootprint& attention,
                                 kernels::ActivationLayout layout) {
  Dims d;
  d.layer_major = order == StageOrder::layer;
  d.B = micro_batch;
  d.T = seq_len;
  d.C = m.d_model;
  d.NHl = m.n_head / s.tp_size;
  d.Cl = d.NHl * m.head_size();
  d.layers = s.layer_end - s.layer_begin;
  // wte rows [v0, v1) of this tensor-parallel rank, of which the first V are real tokens (the
  // rest are padding rows; a shard may hold padding only, V = 0).
  d.v0 = s.tp_rank * m.n_head / s.tp_size * m.padded_vocab / m.n_head;
  d.v1 = (s.tp_rank + 1) * m.n_head / s.tp_size * m.padded_vocab / m.n_head;
  d.V = std::max<std::int64_t>(0, std::min(d.v1, m.vocab_size) - d.v0);
  d.ld = kernels::logits_row_stride(d.V, layout.logits_rows);
  d.embedding = s.has_embedding;
  d.head = s.has_head;
  d.bf16 = bf16;
  d.gemm_io = bf16 && layout.bf16 == kernels::Bf16Activations::gemm_io;
  d.slots = slots;
  d.recompute = recompute;
  d.attn = {.B = static_cast<int>(d.B), .T = static_cast<int>(d.T), .C = static_cast<int>(d.Cl),
            .NH = static_cast<int>(d.NHl), .bf16_inputs = bf16};
  d.attn_saved = attention.saved_floats(d.attn);
  d.attn_scratch = attention.scratch_floats(d.attn);
  return d;
}

template <class Alloc>
void GptStage::allocate_layer(const Dims& d, LayerActs& l, bool keep_saved, Alloc&& alloc) {
  const std::int64_t N = d.B * d.T, C = d.C, Cl = d.Cl;
  if (d.bf16) {
    alloc(l.ln1_h, N * C), alloc(l.atty_h, N * Cl), alloc(l.ln2_h, N * C);
    alloc(l.fch_gelu_h, N * 4 * Cl);
  } else {
    alloc(l.ln1, N * C), alloc(l.ln2, N * C), alloc(l.fch_gelu, N * 4 * Cl);
  }
  if (d.gemm_io)
    alloc(l.qkv_h, N * 3 * Cl), alloc(l.fch_h, N * 4 * Cl);
  else
    alloc(l.qkv, N * 3 * Cl), alloc(l.atty, N * Cl), alloc(l.fch, N * 4 * Cl);
  alloc(l.ln1_mean, N), alloc(l.ln1_rstd, N);
  if (keep_saved) alloc(l.attn_saved, d.attn_saved);
  alloc(l.attproj, N * C), alloc(l.residual2, N * C);
  alloc(l.ln2_mean, N), alloc(l.ln2_rstd, N);
  alloc(l.fcproj, N * C), alloc(l.residual3, N * C);
}

template <class Alloc>
void GptStage::allocate(const Dims& d, Activations& a, Alloc&& alloc) {
  const std::int64_t N = d.B * d.T, C = d.C, Cl = d.Cl;
  a.slots.resize(static_cast<std::size_t>(d.slots));
  for (SlotActs& s : a.slots) {
    alloc(s.tokens, N), alloc(s.targets, N), alloc(s.input, N * C);
    s.layers.resize(static_cast<std::size_t>(d.layers));
    for (LayerActs& l : s.layers) {
      if (d.recompute == Recompute::full)
        alloc(l.residual3, N * C);  // the next layer's input; the rest is recomputed
      else
        allocate_layer(d, l, d.recompute == Recompute::none, alloc);
    }
    if (d.head) {
      if (d.bf16)
        alloc(s.lnf_h, N * C);
      else
        alloc(s.lnf, N * C);
      alloc(s.lnf_mean, N), alloc(s.lnf_rstd, N);
      if (d.gemm_io)
        alloc(s.logits_h, N * d.ld), alloc(s.ce_stats, 3 * N);
      else
        alloc(s.logits, N * d.ld), alloc(s.ce_stats, 2 * N);
      alloc(s.losses, N), alloc(s.rowmax, N);
    }
    if (d.layer_major) alloc(s.dresidual, N * C);
  }
  alloc(a.attn_scratch, d.attn_scratch);
  if (d.recompute == Recompute::full) allocate_layer(d, a.recompute_layer, true, alloc);
  if (d.recompute == Recompute::attention) {
    alloc(a.attn_saved_scratch, d.attn_saved);
    if (d.gemm_io)
      alloc(a.atty_scratch_h, N * Cl);
    else
      alloc(a.atty_scratch, N * Cl);
  }
  GradScratch& g = a.grads;
  alloc(g.dresidual, N * C), alloc(g.dln, N * C), alloc(g.dqkv, N * 3 * Cl);
  alloc(g.datty, N * Cl);
  if (d.gemm_io)
    alloc(g.dfch_h, N * 4 * Cl);
  else
    alloc(g.dfch, N * 4 * Cl);
  if (d.head) alloc(g.dlosses, N), alloc(a.loss_ledger, kLedgerSize);
  // (gemm_io: the head's dlogits are bf16 already, never rounded into dout_h)
  if (d.bf16) alloc(g.dout_h, N * std::max({4 * Cl, C, d.head && !d.gemm_io ? d.ld : 0}));
}

std::int64_t GptStage::memory_bytes(const ModelShape& m, const StageSpec& s,
                                    std::int64_t micro_batch, std::int64_t seq_len, int slots,
                                    Recompute recompute, Precision precision,
                                    StageOrder order, const kernels::AttentionFootprint& attention,
                                    kernels::ActivationLayout layout) {
  const Dims d = dims_of(m, s, micro_batch, seq_len, slots, recompute,
                         precision == Precision::bf16, order, attention, layout);
  return allocated_bytes(d);
}

std::int64_t GptStage::allocated_bytes(const Dims& d) {
  Activations plan;  // buffers stay empty: only their sizes are counted
  std::int64_t bytes = 0;
  allocate(d, plan, [&bytes](auto& buffer, std::int64_t n) {
    bytes += n * static_cast<std::int64_t>(sizeof(*buffer.data()));
  });
  return bytes;
}

void GptStage::linear_forward(float* out, const Buf<float>& x, const Buf<bf16>& x_h, TensorId w,
                              std::int64_t l, const float* bias, std::int64_t C, std::int64_t OC,
                              std::int64_t ld) {
  const int N = static_cast<int>(dims_.B * dims_.T), iC = static_cast<int>(C),
            iOC = static_cast<int>(OC), ild = static_cast<int>(ld == 0 ? OC : ld);
  if (dims_.bf16)
    k_.gemm().matmul_forward(out, x_h.data(), p_.param_bf16(w, l), bias, N, iC, iOC, ild);
  else
    k_.gemm().matmul_forward(out, x.data(), p_.param(w, l), bias, N, iC, iOC, ild);
}

void GptStage::linear_backward(float* dx, float* dweight, float* dbias, const float* dout,
                               const Buf<float>& x, const Buf<bf16>& x_h, TensorId w,
                               std::int64_t l, std::int64_t C, std::int64_t OC, std::int64_t ld) {
  const int N = static_cast<int>(dims_.B * dims_.T), iC = static_cast<int>(C),
            iOC = static_cast<int>(OC), ild = static_cast<int>(ld == 0 ? OC : ld);
  if (dims_.bf16)
    k_.gemm().matmul_backward(dx, dweight, dbias, dout, acts_.grads.dout_h.data(), x_h.data(),
                              p_.param_bf16(w, l), N, iC, iOC, ild,
                              kernels::GradWrite::overwrite);
  else
    k_.gemm().matmul_backward(dx, dweight, dbias, dout, x.data(), p_.param(w, l), N, iC, iOC, ild,
                              kernels::GradWrite::overwrite);
}

// In bf16 precision LayerNorm writes its (matmul input) output as bf16 directly.
void GptStage::layernorm_forward(Buf<float>& out, Buf<bf16>& out_h, Buf<float>& mean,
                                 Buf<float>& rstd, const float* inp, TensorId w, TensorId b,
                                 std::int64_t l) {
  const int N = static_cast<int>(dims_.B * dims_.T), C = static_cast<int>(dims_.C);
  if (dims_.bf16)
    k_.norm().layernorm_forward(out_h.data(), mean.data(), rstd.data(), inp, p_.param(w, l),
                                p_.param(b, l), N, C);
  else
    k_.norm().layernorm_forward(out.data(), mean.data(), rstd.data(), inp, p_.param(w, l),
                                p_.param(b, l), N, C);
}

const float* GptStage::logits(int slot) const {
  PDT_CHECK(!dims_.gemm_io, "the stage's logits are bf16 (bf16 activations): no fp32 logits");
  return acts_.slots[slot].logits.data();
}

const float* GptStage::output(int slot) const {
  const SlotActs& a = acts_.slots[slot];
  return dims_.layers > 0 ? a.layers.back().residual3.data() : a.input.data();
}

// The stage's program forward: each step announces the units it reads, then runs.
template <class Body>
void GptStage::run_forward(Body&& body) {
  for (const StageStep& s : program_.steps()) {
    p_.need(s.units);
    body(s);
  }
}

// Backward: the steps in reverse, each announcing the units it reads and, around its
// arithmetic, the units whose gradients it adds into.
template <class Body>
void GptStage::run_backward(Body&& body) {
  const std::vector<StageStep>& steps = program_.steps();
  for (auto s = steps.rbegin(); s != steps.rend(); ++s) {
    if (s->backward_reads_params()) p_.need(s->units);
    p_.grads_begin(s->units);
    body(*s);
    p_.grads_end(s->units);
  }
}

void GptStage::forward_step(const StageStep& s, SlotActs& a) {
  switch (s.kind) {
    case StageStep::Kind::embedding: return embed(a);
    case StageStep::Kind::layer: return forward_kept(s.layer, a);
    case StageStep::Kind::head: return head_and_loss(a);
  }
}

void GptStage::backward_step(const StageStep& s, int slot, float dloss) {
  SlotActs& a = acts_.slots[slot];
  switch (s.kind) {
    case StageStep::Kind::embedding: return encoder_backward(a);
    case StageStep::Kind::layer: return backward_kept(s.layer, a);
    case StageStep::Kind::head: return head_backward(a, output(slot), dloss);
  }
}

void GptStage::forward(int slot, const std::int32_t* tokens, const float* input,
                       const std::int32_t* targets) {
  SlotActs& a = acts_.slots[slot];
  if (dims_.embedding)
    copy_in(a.tokens.data(), tokens, a.tokens.bytes());
  else
    copy_in(a.input.data(), input, a.input.bytes());
  if (dims_.head) copy_in(a.targets.data(), targets, a.targets.bytes());
  run_forward([&](const StageStep& s) { forward_step(s, a); });
}

void GptStage::load(int slot, const std::int32_t* tokens, const std::int32_t* targets) {
  SlotActs& a = acts_.slots[slot];
  copy_in(a.tokens.data(), tokens, a.tokens.bytes());
  copy_in(a.targets.data(), targets, a.targets.bytes());
}

void GptStage::forward_layer_major(int n) {
  PDT_CHECK(dims_.layer_major && n <= dims_.slots, "layer-major forward of " + std::to_string(n) +
                                                       " micro-batches on a stage without it");
  run_forward([&](const StageStep& s) {
    for (int j = 0; j < n; ++j) forward_step(s, acts_.slots[j]);
  });
}

// Vocabulary-parallel lookup: each shard embeds its own tokens (0 elsewhere), one shard adds the
// positions, and the sum over the group is the full embedding.
void GptStage::embed(SlotActs& a) {
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C;
  const float* wpe = tp_.rank() == 0 ? p_.param(Tid::wpe) : nullptr;
  k_.elementwise().encoder_forward(a.input.data(), a.tokens.data(), p_.param(Tid::wte), wpe,
                                   static_cast<int>(dims_.B), static_cast<int>(dims_.T),
                                   static_cast<int>(C), static_cast<int>(dims_.v0),
                                   static_cast<int>(dims_.v1));
  tp_.allreduce_sum(a.input.data(), N * C);
}

void GptStage::forward_kept(std::int64_t i, SlotActs& a) {
  LayerActs& kept = a.layers[i];
  const std::int64_t l = p_.spec().layer_begin + i;
  if (dims_.recompute == Recompute::full) {
    LayerActs& scratch = acts_.recompute_layer;
    layer_forward(l, layer_input(a, i), scratch);
    dev_.copy(kept.residual3.data(), scratch.residual3.data(), kept.residual3.bytes());
  } else {
    layer_forward(l, layer_input(a, i), kept);
  }
}

void GptStage::head_and_loss(SlotActs& a) {
  head_forward(a, dims_.layers > 0 ? a.layers.back().residual3.data() : a.input.data());
  if (ledger_count_ == kLedgerSize) flush_ledger();
  k_.loss().sum_losses(acts_.loss_ledger.data() + ledger_count_++, a.losses.data(),
                       static_cast<int>(dims_.B * dims_.T));
}

void GptStage::flush_ledger() {
  if (ledger_count_ == 0) return;
  const std::size_t old = ledger_host_.size();
  ledger_host_.resize(old + static_cast<std::size_t>(ledger_count_));
  dev_.copy(ledger_host_.data() + old, acts_.loss_ledger.data(),
            static_cast<std::size_t>(ledger_count_) * sizeof(double));
  dev_.synchronize();
  ledger_count_ = 0;
}

double GptStage::take_loss_sum() {
  flush_ledger();
  double sum = 0.0;
  for (double s : ledger_host_) sum += s;
  ledger_host_.clear();
  return sum;
}

void GptStage::layer_forward(std::int64_t l, const float* residual, LayerActs& a) {
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C, Cl = dims_.Cl;
  const int iN = static_cast<int>(N), iC = static_cast<int>(C);
  layernorm_forward(a.ln1, a.ln1_h, a.ln1_mean, a.ln1_rstd, residual, Tid::ln1w, Tid::ln1b, l);
  qkv_and_attention_forward(l, a);
  // Row-parallel projection: partial sums over this shard's heads, summed across the tp group.
  // Its bias is added once, after the sum, in the same pass as the residual add (and ln2).
  linear_forward(a.attproj.data(), a.atty, a.atty_h, Tid::attprojw, l, nullptr, Cl, C);
  tp_.allreduce_sum(a.attproj.data(), N * C);
  const float *ln2w = p_.param(Tid::ln2w, l), *ln2b = p_.param(Tid::ln2b, l);
  if (dims_.bf16)
    k_.norm().residual_layernorm_forward(a.residual2.data(), a.ln2_h.data(), a.ln2_mean.data(),
                                         a.ln2_rstd.data(), residual, a.attproj.data(),
                                         p_.param(Tid::attprojb, l), ln2w, ln2b, iN, iC);
  else
    k_.norm().residual_layernorm_forward(a.residual2.data(), a.ln2.data(), a.ln2_mean.data(),
                                         a.ln2_rstd.data(), residual, a.attproj.data(),
                                         p_.param(Tid::attprojb, l), ln2w, ln2b, iN, iC);
  mlp_hidden_forward(l, a);
  linear_forward(a.fcproj.data(), a.fch_gelu, a.fch_gelu_h, Tid::fcprojw, l, nullptr, 4 * Cl, C);
  tp_.allreduce_sum(a.fcproj.data(), N * C);
  k_.elementwise().bias_residual_forward(a.residual3.data(), a.residual2.data(), a.fcproj.data(),
                                         p_.param(Tid::fcprojb, l), iN, iC);
}

// The MLP's first layer and its GELU in one call (a GPU fuses them into the GEMM): fch and
// gelu(fch), fp32, or bf16 GELU output beside an fp32 fch, or (gemm_io) both in bf16.
void GptStage::mlp_hidden_forward(std::int64_t l, LayerActs& a) {
  const int iN = static_cast<int>(dims_.B * dims_.T), iC = static_cast<int>(dims_.C),
            iH = static_cast<int>(4 * dims_.Cl);
  if (dims_.gemm_io)
    k_.gemm().matmul_gelu_forward(a.fch_h.data(), a.fch_gelu_h.data(), a.ln2_h.data(),
                                  p_.param_bf16(Tid::fcw, l), p_.param_bf16(Tid::fcb, l), iN, iC,
                                  iH);
  else if (dims_.bf16)
    k_.gemm().matmul_gelu_forward(a.fch.data(), a.fch_gelu_h.data(), a.ln2_h.data(),
                                  p_.param_bf16(Tid::fcw, l), p_.param(Tid::fcb, l), iN, iC, iH);
  else
    k_.gemm().matmul_gelu_forward(a.fch.data(), a.fch_gelu.data(), a.ln2.data(),
                                  p_.param(Tid::fcw, l), p_.param(Tid::fcb, l), iN, iC, iH);
}

// qkv = ln1 W^T + b and the attention over it, into a.atty (and in bf16 its bf16 copy a.atty_h,
// the projection's input): with gemm_io the GEMM writes qkv in bf16 and the attention reads it
// and writes atty_h directly.
void GptStage::qkv_and_attention_forward(std::int64_t l, LayerActs& a) {
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C, Cl = dims_.Cl;
  if (dims_.gemm_io) {
    k_.gemm().matmul_forward(a.qkv_h.data(), a.ln1_h.data(), p_.param_bf16(Tid::qkvw, l),
                             p_.param_bf16(Tid::qkvb, l), static_cast<int>(N),
                             static_cast<int>(C), static_cast<int>(3 * Cl),
                             static_cast<int>(3 * Cl));
    k_.attention().forward(a.atty_h.data(), attn_saved_of(a), acts_.attn_scratch.data(),
                           a.qkv_h.data(), dims_.attn);
    return;
  }
  linear_forward(a.qkv.data(), a.ln1, a.ln1_h, Tid::qkvw, l, p_.param(Tid::qkvb, l), C, 3 * Cl);
  k_.attention().forward(a.atty.data(), attn_saved_of(a), acts_.attn_scratch.data(),
                         a.qkv.data(), dims_.attn);
  if (dims_.bf16) k_.elementwise().to_bf16(a.atty_h.data(), a.atty.data(), N * Cl);
}

void GptStage::head_forward(SlotActs& s, const float* residual) {
  const std::int64_t N = dims_.B * dims_.T, V = dims_.V;
  const int iN = static_cast<int>(N), iV = static_cast<int>(V), ild = static_cast<int>(dims_.ld);
  layernorm_forward(s.lnf, s.lnf_h, s.lnf_mean, s.lnf_rstd, residual, Tid::lnfw, Tid::lnfb, 0);
  if (dims_.gemm_io) return fused_classifier_forward(s);
  // Tied head over this rank's vocabulary shard, real tokens only: padded wte rows never enter
  // (llm.c masks them out of the softmax; skipping them is the same and cheaper). Rows of
  // logits are ld apart (padded for aligned tensor-core GEMMs).
  if (V > 0)
    linear_forward(s.logits.data(), s.lnf, s.lnf_h, Tid::wte, 0, nullptr, dims_.C, V, dims_.ld);
  // Parallel cross-entropy: only per-row statistics cross the group, never logits; no
  // probabilities are stored (the backward recomputes them in its one pass).
  k_.loss().crossentropy_rowmax(s.rowmax.data(), s.logits.data(), iN, iV, ild);
  tp_.allreduce_max(s.rowmax.data(), N);
  k_.loss().crossentropy_partials(s.ce_stats.data(), s.logits.data(), s.rowmax.data(),
                                  s.targets.data(), static_cast<int>(dims_.v0), iN, iV, ild);
  tp_.allreduce_sum(s.ce_stats.data(), 2 * N);
  k_.loss().crossentropy_losses(s.losses.data(), s.ce_stats.data(), iN);
}

// gemm_io (a GPU's bf16 runs): the head GEMM writes bf16 logits and one pass per row gives the
// shard's statistics (online max and sum); with tensor parallelism they are moved to the
// group's max before the same sum over the group as above.
void GptStage::fused_classifier_forward(SlotActs& s) {
  const std::int64_t N = dims_.B * dims_.T;
  const int iN = static_cast<int>(N), iV = static_cast<int>(dims_.V),
            ild = static_cast<int>(dims_.ld), v0 = static_cast<int>(dims_.v0);
  if (iV > 0)
    k_.gemm().matmul_forward(s.logits_h.data(), s.lnf_h.data(), p_.param_bf16(Tid::wte, 0),
                             nullptr, iN, static_cast<int>(dims_.C), iV, ild);
  k_.loss().crossentropy_forward(s.rowmax.data(), s.ce_stats.data(), s.logits_h.data(),
                                 s.targets.data(), v0, iN, iV, ild);
  if (tp_.size() > 1) {
    tp_.allreduce_max(s.rowmax.data(), N);
    k_.loss().crossentropy_rescale(s.ce_stats.data(), s.rowmax.data(), s.targets.data(), v0, iN,
                                   iV);
    tp_.allreduce_sum(s.ce_stats.data(), 2 * N);
  }
  k_.loss().crossentropy_losses(s.losses.data(), s.ce_stats.data(), iN);
}

// The head's backward leaves d(last residual) in the scratch's dresidual; a stage without the
// head receives it from the next stage.
void GptStage::backward(int slot, float dloss, const float* doutput) {
  GradScratch& g = acts_.grads;
  if (!dims_.head) copy_in(g.dresidual.data(), doutput, g.dresidual.bytes());
  run_backward([&](const StageStep& s) { backward_step(s, slot, dloss); });
}

void GptStage::backward_layer_major(int n, float dloss) {
  PDT_CHECK(dims_.layer_major && n <= dims_.slots, "layer-major backward of " +
                                                       std::to_string(n) +
                                                       " micro-batches on a stage without it");
  run_backward([&](const StageStep& s) {
    for (int j = 0; j < n; ++j)
      with_dresidual_of(acts_.slots[j], [&] { backward_step(s, j, dloss); });
  });
}

void GptStage::backward_kept(std::int64_t i, SlotActs& a) {
  const std::int64_t l = p_.spec().layer_begin + i;
  if (dims_.recompute == Recompute::full) {
    layer_forward(l, layer_input(a, i), acts_.recompute_layer);  // same inputs, same bits
    layer_backward(l, layer_input(a, i), acts_.recompute_layer);
  } else {
    layer_backward(l, layer_input(a, i), a.layers[i]);
  }
}

void GptStage::encoder_backward(SlotActs& a) {
  k_.elementwise().encoder_backward(
      p_.grad(Tid::wte), p_.grad(Tid::wpe), acts_.grads.dresidual.data(), a.tokens.data(),
      static_cast<int>(dims_.B), static_cast<int>(dims_.T), static_cast<int>(dims_.C),
      static_cast<int>(dims_.v0), static_cast<int>(dims_.v1));
}

void GptStage::head_backward(SlotActs& s, const float* residual, float dloss) {
  GradScratch& g = acts_.grads;
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C;
  const int iN = static_cast<int>(N), iC = static_cast<int>(C);
  k_.elementwise().fill(g.dlosses.data(), N, dloss);
  if (dims_.gemm_io)
    fused_classifier_backward(s);
  else
    classifier_backward(s);
  tp_.allreduce_sum(g.dln.data(), N * C);  // partial over the vocabulary shards
  k_.norm().layernorm_backward(g.dresidual.data(), p_.grad(Tid::lnfw), p_.grad(Tid::lnfb),
                               g.dln.data(), residual, p_.param(Tid::lnfw), s.lnf_mean.data(),
                               s.lnf_rstd.data(), iN, iC, kernels::GradWrite::overwrite);
}

// The slot's logits become dlogits, then d(lnf) = dlogits wte (written) and dwte += dlogits^T lnf.
void GptStage::classifier_backward(SlotActs& s) {
  GradScratch& g = acts_.grads;
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C, V = dims_.V;
  const int iN = static_cast<int>(N);
  // The slot's logits become dlogits (softmax, loss gradient and padding in one pass); input
  // gradients are written, not cleared and added to (GradWrite::overwrite: the same bits).
  k_.loss().crossentropy_backward(s.logits.data(), s.rowmax.data(), s.ce_stats.data(),
                                  s.targets.data(), g.dlosses.data(), static_cast<int>(dims_.v0),
                                  iN, static_cast<int>(V), static_cast<int>(dims_.ld));
  if (V > 0)
    linear_backward(g.dln.data(), p_.grad(Tid::wte), nullptr, s.logits.data(), s.lnf, s.lnf_h,
                    Tid::wte, 0, C, V, dims_.ld);
  else
    zero(g.dln);  // a shard of padding rows only: its part of the sum is 0
}

// gemm_io: one pass writes the bf16 dlogits over the bf16 logits, which both GEMMs read (no
// rounding pass).
void GptStage::fused_classifier_backward(SlotActs& s) {
  GradScratch& g = acts_.grads;
  const int iN = static_cast<int>(dims_.B * dims_.T), iC = static_cast<int>(dims_.C),
            iV = static_cast<int>(dims_.V), ild = static_cast<int>(dims_.ld);
  k_.loss().crossentropy_backward(s.logits_h.data(), s.rowmax.data(), s.ce_stats.data(),
                                  s.targets.data(), g.dlosses.data(), static_cast<int>(dims_.v0),
                                  iN, iV, ild);
  if (iV > 0)
    k_.gemm().matmul_backward(g.dln.data(), p_.grad(Tid::wte), nullptr, s.logits_h.data(),
                              s.lnf_h.data(), p_.param_bf16(Tid::wte, 0), iN, iC, iV, ild,
                              kernels::GradWrite::overwrite);
  else
    zero(g.dln);  // a shard of padding rows only: its part of the sum is 0
}

// The MLP's two GEMMs backward, leaving d(ln2) in g.dln: the projection's backward goes through
// the GELU too (dfch = gelu'(fch) * (dresidual W), one GEMM on a GPU). With bf16 activations
// (gemm_io) that GEMM writes dfch in bf16, which the first layer's backward reads as its output
// gradient (its bias gradient summed from those bf16 values).
void GptStage::mlp_backward(std::int64_t l, LayerActs& a) {
  GradScratch& g = acts_.grads;
  const int iN = static_cast<int>(dims_.B * dims_.T), iC = static_cast<int>(dims_.C),
            iH = static_cast<int>(4 * dims_.Cl);
  if (dims_.gemm_io) {
    k_.gemm().matmul_backward_gelu(g.dfch_h.data(), p_.grad(Tid::fcprojw, l),
                                   p_.grad(Tid::fcprojb, l), g.dresidual.data(), g.dout_h.data(),
                                   a.fch_h.data(), a.fch_gelu_h.data(),
                                   p_.param_bf16(Tid::fcprojw, l), iN, iH, iC);
    k_.gemm().matmul_backward(g.dln.data(), p_.grad(Tid::fcw, l), p_.grad(Tid::fcb, l),
                              g.dfch_h.data(), a.ln2_h.data(), p_.param_bf16(Tid::fcw, l), iN, iC,
                              iH, iH, kernels::GradWrite::overwrite);
    return;
  }
  if (dims_.bf16)
    k_.gemm().matmul_backward_gelu(g.dfch.data(), p_.grad(Tid::fcprojw, l),
                                   p_.grad(Tid::fcprojb, l), g.dresidual.data(), g.dout_h.data(),
                                   a.fch.data(), a.fch_gelu_h.data(),
                                   p_.param_bf16(Tid::fcprojw, l), iN, iH, iC);
  else
    k_.gemm().matmul_backward_gelu(g.dfch.data(), p_.grad(Tid::fcprojw, l),
                                   p_.grad(Tid::fcprojb, l), g.dresidual.data(), a.fch.data(),
                                   a.fch_gelu.data(), p_.param(Tid::fcprojw, l), iN, iH, iC);
  linear_backward(g.dln.data(), p_.grad(Tid::fcw, l), p_.grad(Tid::fcb, l), g.dfch.data(), a.ln2,
                  a.ln2_h, Tid::fcw, l, dims_.C, 4 * dims_.Cl);
}

// dqkv += the attention's input gradient of g.datty, recomputing what the attention saves where
// this layer did not keep it (its output, the same bits as the kept one, goes to scratch). The
// backend owns its scratch: nothing to clear.
void GptStage::attention_backward(LayerActs& a) {
  GradScratch& g = acts_.grads;
  const bool recompute = a.attn_saved.empty();
  if (dims_.gemm_io) {
    if (recompute)
      k_.attention().forward(acts_.atty_scratch_h.data(), acts_.attn_saved_scratch.data(),
                             acts_.attn_scratch.data(), a.qkv_h.data(), dims_.attn);
    k_.attention().backward(g.dqkv.data(), acts_.attn_scratch.data(), g.datty.data(),
                            a.qkv_h.data(), a.atty_h.data(), attn_saved_of(a), dims_.attn);
    return;
  }
  if (recompute)
    k_.attention().forward(acts_.atty_scratch.data(), acts_.attn_saved_scratch.data(),
                           acts_.attn_scratch.data(), a.qkv.data(), dims_.attn);
  k_.attention().backward(g.dqkv.data(), acts_.attn_scratch.data(), g.datty.data(),
                          a.qkv.data(), a.atty.data(), attn_saved_of(a), dims_.attn);
}

// On entry g.dresidual holds d(residual3); on exit d(layer input). llm.c's trick: the residual
// gradient flows through unchanged and each LayerNorm backward adds its branch into it. The
// branch gradients (dfch, dln, datty) are written by the op that makes them
// (GradWrite::overwrite), never cleared first; dqkv is cleared (attention adds into it).
void GptStage::layer_backward(std::int64_t l, const float* residual, LayerActs& a) {
  GradScratch& g = acts_.grads;
  const std::int64_t N = dims_.B * dims_.T, C = dims_.C, Cl = dims_.Cl;
  const int iN = static_cast<int>(N), iC = static_cast<int>(C);
  mlp_backward(l, a);
  tp_.allreduce_sum(g.dln.data(), N * C);  // column-parallel input gradient
  k_.norm().layernorm_backward(g.dresidual.data(), p_.grad(Tid::ln2w, l), p_.grad(Tid::ln2b, l),
                               g.dln.data(), a.residual2.data(), p_.param(Tid::ln2w, l),
                               a.ln2_mean.data(), a.ln2_rstd.data(), iN, iC,
                               kernels::GradWrite::accumulate);
  linear_backward(g.datty.data(), p_.grad(Tid::attprojw, l), p_.grad(Tid::attprojb, l),
                  g.dresidual.data(), a.atty, a.atty_h, Tid::attprojw, l, Cl, C);
  zero(g.dqkv);
  attention_backward(a);
  linear_backward(g.dln.data(), p_.grad(Tid::qkvw, l), p_.grad(Tid::qkvb, l), g.dqkv.data(),
                  a.ln1, a.ln1_h, Tid::qkvw, l, C, 3 * Cl);
  tp_.allreduce_sum(g.dln.data(), N * C);
  k_.norm().layernorm_backward(g.dresidual.data(), p_.grad(Tid::ln1w, l), p_.grad(Tid::ln1b, l),
                               g.dln.data(), residual, p_.param(Tid::ln1w, l), a.ln1_mean.data(),
                               a.ln1_rstd.data(), iN, iC, kernels::GradWrite::accumulate);
}

}  // namespace pdtrain
