#pragma once
// The commands that work on files rather than train: inspect a checkpoint, export one to
// llm.c's or Hugging Face's format. Single-process (rank 0 of the job).
#include <string>

#include "pdtrain/app/sample.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"

namespace pdtrain {

// A checkpoint's parameters as the canonical flat array of its model (at its full context:
// seq_len = max_seq_len), read on this process alone.
struct CheckpointParams {
  ckpt::CheckpointMeta meta;
  ParamCatalog catalog;
  std::vector<float> canonical;
};
CheckpointParams read_params(const std::string& checkpoint);

// Prints step, codec, anchor, each tensor's shape, stored and raw bytes, and CRC status;
// throws Error(data) after printing when the file is damaged or incomplete (exit status 4).
void inspect_checkpoint(const std::string& path);

// Writes the parameters of checkpoint `path` as an llm.c GPT-2 checkpoint (header + fp32
// parameters in llm.c's order); a round trip llm.c -> pdtrain -> llm.c is bit-identical.
void export_llmc(const std::string& checkpoint, const std::string& out);

// Writes the parameters of checkpoint `path` as a Hugging Face GPT-2 directory `out_dir`
// (config.json + model.safetensors, interop/hf_gpt2), which transformers'
// GPT2LMHeadModel.from_pretrained loads as it is; model.init = "hf:OUT_DIR" reads it back.
void export_hf(const std::string& checkpoint, const std::string& out_dir);

// `pdtrain sample`: text generated from a checkpoint's model on this process. A model trained
// on text (data.source = "text", bytes) takes a text prompt and prints text; one trained on
// token shards takes token ids ("464 3290") and prints ids, or text decoded with an llm.c
// tokenizer file. Without a prompt, generation starts from a newline (bytes) or the
// end-of-text token (50256 for GPT-2's vocabulary, else 0).
struct SampleCommand {
  std::string checkpoint, prompt, tokenizer;
  bool has_prompt = false;
  SampleSettings settings;
};
void sample_checkpoint(const SampleCommand& c);

}  // namespace pdtrain
