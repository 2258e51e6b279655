#include "pdtrain/app/sample.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
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
        pick(stage.logits(0) + (n - 1) * stage.logits_row_stride(), m.vocab_size, settings,
             static_cast<std::uint64_t>(all.size()));
    all.push_back(next);
    out.push_back(next);
  }
  return out;
}

std::string tokens_text(const std::vector<std::int32_t>& tokens, bool bytes) {
  std::string text;
  for (std::int32_t t : tokens)
    text += bytes ? std::string(1, static_cast<char>(t))
                  : (text.empty() ? "" : " ") + std::to_string(t);
  return text;
}

HolderHooks with_training_samples(HolderHooks hooks, const Deck& deck, const ParamCatalog& cat,
                                  MPI_Comm holders) {
  if (deck.train.sample_every <= 0) return hooks;
  if (cat.total_numel() > std::numeric_limits<int>::max())  // one MPI_Gatherv of int counts
    throw Error(ExitCode::deck, deck.where("train.sample_every") +
                                    ": the model is too large to gather for samples during "
                                    "training; sample its checkpoints with pdtrain sample");
  const std::int64_t every = deck.train.sample_every;
  const bool bytes = deck.data.source == "text";
  SampleSettings settings;
  settings.tokens = 64;
  settings.seed = static_cast<std::uint64_t>(deck.run.seed);
  auto inner = hooks.after_update;
  hooks.after_update = [inner, every, bytes, settings, &cat, holders](
                           std::int64_t version, const HolderHooks::BlocksGetter& get) {
    if (version % every == 0) {
      std::vector<float> mine;  // this owner's blocks, in block order
      std::vector<int> ids;
      for (const auto& [id, state] : get()) {
        mine.insert(mine.end(), state->param.begin(), state->param.end());
        ids.push_back(id);
      }
      int rank = 0, size = 0;
      MPI_CHECK(MPI_Comm_rank(holders, &rank));
      MPI_CHECK(MPI_Comm_size(holders, &size));
      const int n = static_cast<int>(mine.size()), nb = static_cast<int>(ids.size());
      std::vector<int> counts(static_cast<std::size_t>(size)), offsets(counts.size(), 0);
      std::vector<int> id_counts(counts.size()), id_offsets(counts.size(), 0);
      MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, holders));
      MPI_CHECK(MPI_Gather(&nb, 1, MPI_INT, id_counts.data(), 1, MPI_INT, 0, holders));
      for (int h = 1; h < size; ++h) {
        offsets[h] = offsets[h - 1] + counts[h - 1];
        id_offsets[h] = id_offsets[h - 1] + id_counts[h - 1];
      }
      std::vector<float> packed(rank == 0 ? static_cast<std::size_t>(cat.total_numel()) : 0);
      std::vector<int> packed_ids(rank == 0 ? cat.blocks().size() : 0);
      MPI_CHECK(MPI_Gatherv(mine.data(), n, MPI_FLOAT, packed.data(), counts.data(),
                            offsets.data(), MPI_FLOAT, 0, holders));
      MPI_CHECK(MPI_Gatherv(ids.data(), nb, MPI_INT, packed_ids.data(), id_counts.data(),
                            id_offsets.data(), MPI_INT, 0, holders));
      if (rank == 0) {
        // Owners' blocks one owner after another: each need not be a contiguous range of ids
        // (holders placed near their fetchers, the baseline's tensor-parallel shards).
        std::vector<float> canonical(packed.size());
        std::int64_t at = 0;
        for (int id : packed_ids) {
          const BlockInfo& b = cat.block(id);
          cat.scatter_block(b, packed.data() + at, canonical.data());
          at += b.numel();
        }
        const std::int32_t start = bytes ? '\n' : cat.shape().vocab_size == 50257 ? 50256 : 0;
        const auto out = generate(cat, canonical, {start}, settings);
        std::printf("sample at step %lld: %s\n", static_cast<long long>(version),
                    tokens_text(out, bytes).c_str());
        std::fflush(stdout);
      }
    }
    if (inner) inner(version, get);
  };
  return hooks;
}

}  // namespace pdtrain
