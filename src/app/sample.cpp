#include "pdtrain/app/sample.hpp"

#include <algorithm>
#include <cmath>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"

namespace pdtrain {
namespace {

constexpr std::uint64_t kSamplePurpose = 0x73616d706c65;  // "sample": its own random stream

// The next token from one row of logits: the arg max at temperature 0, else a draw from
// softmax(logits / T) by inverse CDF (in double, so the draw is the same on every machine).
std::int32_t pick(const float* logits, std::int64_t V, const SampleSettings& s,
                  std::uint64_t position) {
  if (s.temperature <= 0)
    return static_cast<std::int32_t>(std::max_element(logits, logits + V) - logits);
  const float top = *std::max_element(logits, logits + V);
  std::vector<double> p(static_cast<std::size_t>(V));
  double sum = 0;
  for (std::int64_t v = 0; v < V; ++v) sum += p[v] = std::exp((logits[v] - top) / s.temperature);
  double u = rng_uniform(rng_key(s.seed, kSamplePurpose), position) * sum;
  for (std::int64_t v = 0; v < V; ++v)
    if ((u -= p[v]) < 0) return static_cast<std::int32_t>(v);
  return static_cast<std::int32_t>(V - 1);  // rounding left u at the very end
}

}  // namespace

std::vector<std::int32_t> generate(const ParamCatalog& cat, const std::vector<float>& canonical,
                                   const std::vector<std::int32_t>& context,
                                   const SampleSettings& settings) {
  const ModelShape& m = cat.shape();
  if (context.empty()) throw Error(ExitCode::deck, "sampling needs at least one context token");
  for (std::int32_t t : context)
    if (t < 0 || t >= m.vocab_size)
      throw Error(ExitCode::deck, "prompt token " + std::to_string(t) + " is outside the model's " +
                                      std::to_string(m.vocab_size) + "-token vocabulary");
  StageParams params(cat, StageSpec{0, m.n_layer, true, true, 1, 0});
  std::vector<float> packed;
  for (int id : params.needed_blocks()) {
    const BlockInfo& b = cat.block(id);
    packed.resize(static_cast<std::size_t>(b.numel()));
    cat.gather_block(b, canonical.data(), packed.data());
    params.unpack_param(b, packed.data());
  }
  params.upload_params();
  // A window as long as needed, at most the position table: positions after the last real
  // token do not change its logits (causal attention), so they are left 0.
  const std::int64_t total = static_cast<std::int64_t>(context.size()) + settings.tokens;
  const std::int64_t T = std::min<std::int64_t>(m.max_seq_len, total);
  NoTensorParallel tp;
  GptStage stage(params, 1, T, tp);
  std::vector<std::int32_t> all = context, window(static_cast<std::size_t>(T)),
                            targets(static_cast<std::size_t>(T), 0);
  std::vector<std::int32_t> out;
  for (std::int64_t i = 0; i < settings.tokens; ++i) {
    const std::int64_t n = std::min<std::int64_t>(T, static_cast<std::int64_t>(all.size()));
    std::fill(window.begin(), window.end(), 0);
    std::copy(all.end() - n, all.end(), window.begin());
    stage.forward(0, window.data(), nullptr, targets.data());
    stage.take_loss_sum();  // keeps the loss ledger from filling up
    const std::int32_t next =
        pick(stage.logits(0) + (n - 1) * m.vocab_size, m.vocab_size, settings,
             static_cast<std::uint64_t>(all.size()));
    all.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace pdtrain
