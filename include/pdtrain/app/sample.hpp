#pragma once
// Text from a model: autoregressive sampling on one process (the CPU), with GptStage's forward.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/model/catalog.hpp"
#include "pdtrain/pd/holder_server.hpp"

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

// The text of tokens of a model trained on bytes (data.source = "text"), else their ids.
std::string tokens_text(const std::vector<std::int32_t>& tokens, bool bytes);

// train.sample_every = N: `hooks` with an after_update that, every N-th update, gathers the
// parameters on holder 0 of `holders` (each holder's blocks are a contiguous run in block
// order, so one gather in holder order is the canonical order) and prints 64 sampled tokens.
HolderHooks with_training_samples(HolderHooks hooks, const Deck& deck, const ParamCatalog& cat,
                                  MPI_Comm holders);

}  // namespace pdtrain
