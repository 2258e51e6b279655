#pragma once
// llm.c's GPT-2 checkpoint format (train_gpt2.c, gpt2_build_from_checkpoint / gpt2_write_to_checkpoint):
//
//   256 little-endian int32: [0] magic 20240326, [1] version (3 = fp32 parameters; 5 = bf16,
//   not supported), [2] max_seq_len, [3] vocab_size, [4] num_layers, [5] num_heads,
//   [6] channels, [7] padded_vocab_size, the rest zero;
//   then every parameter as little-endian fp32 in llm.c's order and shapes, which is exactly
//   pdtrain's canonical flat array (ParamCatalog): Vp*C + maxT*C + L*(12 C^2 + 13 C) + 2 C floats.
//
// Padded vocabulary rows (wte rows vocab_size..padded_vocab_size-1) are kept as stored when
// reading and written as pdtrain has them (zeros when pdtrain trained them: their gradient is 0).
//
// Every input error throws pdtrain::Error(ExitCode::data) naming the file and the field.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

inline constexpr int kLlmcMagic = 20240326;
inline constexpr int kLlmcVersionFp32 = 3;
inline constexpr int kLlmcVersionBf16 = 5;
inline constexpr int kLlmcHeaderInts = 256;
inline constexpr std::int64_t kLlmcHeaderBytes = 4 * kLlmcHeaderInts;  // 1024

struct LlmcHeader {
  int magic, version, max_seq_len, vocab_size, n_layer, n_head, channels, padded_vocab_size;
};

// llm.c's parameter count for a header: Vp*C + maxT*C + L*(12 C^2 + 13 C) + 2 C.
std::int64_t llmc_param_count(const LlmcHeader& h);

// Reads and validates the header and the file size. Throws Error(ExitCode::data) naming the
// file and the field for: an unreadable file, a short header, a wrong magic, an unsupported
// version, non-positive fields, channels % num_heads != 0, padded_vocab_size < vocab_size,
// and a file size other than 1024 + 4 * (parameter count) (both numbers are given).
LlmcHeader read_llmc_header(const std::string& path);

// The ModelShape a header implies, training on sequences of `seq_len` tokens (the deck's
// model.seq_len). Throws Error(ExitCode::data) naming model.seq_len and `path` if seq_len is
// not in 1..max_seq_len.
ModelShape shape_from_llmc(const LlmcHeader& h, std::int64_t seq_len, const std::string& path);

// Checks the header against a resolved deck shape (model.max_seq_len = 0 must have been resolved
// to the file's beforehand, e.g. with shape_from_llmc). Throws Error(ExitCode::data) naming the
// first disagreeing field: "model.n_layer = 6 in the deck but num_layers = 12 in FILE".
void check_llmc_shape(const LlmcHeader& h, const ModelShape& shape, const std::string& path);

// Reads the header, checks it against cat.shape() and reads the parameters into `canonical`
// (resized to cat.total_numel()).
void read_llmc_params(const std::string& path, const ParamCatalog& cat,
                      std::vector<float>& canonical);

// Writes header + canonical parameters (cat.total_numel() floats) to PATH.tmp, then renames it
// to PATH, so PATH is never half-written. Reading it back is bit-identical. Throws
// Error(ExitCode::runtime) naming the file if it cannot be written, and Error(ExitCode::data)
// if the shape does not fit llm.c's int32 header.
void write_llmc(const std::string& path, const ParamCatalog& cat, const float* canonical);

}  // namespace pdtrain
