#pragma once
// The commands that work on files rather than train: inspect a checkpoint, export one to
// llm.c's or Hugging Face's format. Single-process (rank 0 of the job).
#include <string>

namespace pdtrain {

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

}  // namespace pdtrain
