#pragma once
// GPT-2 as Hugging Face transformers saves it (GPT2LMHeadModel.save_pretrained, safetensors):
// DIR/config.json and DIR/model.safetensors with tensors named transformer.wte.weight,
// transformer.h.<l>.attn.c_attn.weight, ... (the prefix "transformer." may be absent, as in
// files saved from GPT2Model). Its linear layers are Conv1D, whose weights are [in, out]: the
// transpose of llm.c's [out, in]. The vocabulary is vocab_size rows (llm.c pads it to
// padded_vocab_size), and the head is tied to wte, so lm_head.weight is not stored.
//
// Every input error is Error(ExitCode::data) naming the file and the key or tensor.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

// The shape fields of a GPT-2 config.json.
struct HfGpt2Config {
  std::int64_t n_layer = 0, n_head = 0, n_embd = 0, vocab_size = 0, n_positions = 0;
};

// DIR/config.json, checked to describe the GPT-2 pdtrain computes: model_type "gpt2", a tanh
// GELU ("gelu_new"), LayerNorm epsilon 1e-5, n_inner 4 n_embd, a tied head, no cross attention,
// no per-layer attention scaling.
HfGpt2Config read_hf_config(const std::string& dir);

// The ModelShape of a config: the vocabulary padded to `padded_vocab` rows (0: vocab_size
// rounded up to a multiple of 128, as llm.c does), training on `seq_len` tokens.
ModelShape shape_from_hf(const HfGpt2Config& c, std::int64_t padded_vocab, std::int64_t seq_len);

// Reads DIR's config.json (checked against cat.shape()) and model.safetensors into `canonical`
// (cat.total_numel() floats): every GPT-2 tensor present with its shape, in F32, BF16 or F16;
// no tensor pdtrain does not know (the attention-mask buffers "attn.bias"/"attn.masked_bias"
// of older files are skipped, an lm_head.weight must equal wte). Padded vocabulary rows are
// zero, as llm.c pads them.
void read_hf_params(const std::string& dir, const ParamCatalog& cat, std::vector<float>& canonical);

// Writes DIR/config.json and DIR/model.safetensors (fp32, GPT2LMHeadModel's names) for the
// canonical parameters (cat.total_numel() floats), creating DIR. Each file is written whole or
// not at all (io/output_file). Reading it back gives the same parameters, padded rows zero.
void write_hf(const std::string& dir, const ParamCatalog& cat, const float* canonical);

}  // namespace pdtrain
