#pragma once
// Text from a model: autoregressive sampling on one process (the CPU), with GptStage's forward.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

struct SampleSettings {
  std::int64_t tokens = 256;   // new tokens to generate
  double temperature = 1.0;    // 0: greedy (the first most likely token)
  std::uint64_t seed = 1337;   // draws depend on (seed, position) only
};

// `context` continued by settings.tokens tokens of the model `canonical` (cat.total_numel()
// floats, canonical order). Each new token runs one forward over the window of the last
// max_seq_len tokens (no KV cache: a window of at most max_seq_len tokens per token) and draws
// from softmax(logits / temperature) over the real vocabulary. Returns the new tokens only.
std::vector<std::int32_t> generate(const ParamCatalog& cat, const std::vector<float>& canonical,
                                   const std::vector<std::int32_t>& context,
                                   const SampleSettings& settings);

}  // namespace pdtrain
