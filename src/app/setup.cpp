// The set-up every rank does alike: layout, catalogue, block table and placement, data source.
#include "pdtrain/app/setup.hpp"

#include <cstdio>
#include <string>

#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/layout/placement.hpp"
#include "pdtrain/model/llmc_format.hpp"
#include "pdtrain/pd/param_cache.hpp"

namespace pdtrain {

namespace {

data::SourceSpec source_spec(const Deck& d) {
  data::SourceSpec s;
  s.kind = *data::source_kind_from_string(d.data.source);
  s.path = d.data.path;
  s.val_path = d.data.val_path;
  s.val_fraction = d.data.val_fraction;
  s.vocab_size = d.model.vocab_size;
  s.seq_len = d.model.seq_len;
  s.seed = d.run.seed;
  s.copy_lag = d.data.copy_lag;
  s.copy_prob = d.data.copy_prob;
  s.batch_size = d.train.batch_size;
  return s;
}

std::string llmc_init_path(const Deck& d) {
  return d.model.init.rfind("llmc:", 0) == 0 ? d.model.init.substr(5) : std::string();
}

// The deck's model, completed by the header of an llm.c init file (its position table and
// padded vocabulary when the deck leaves them 0) and checked against it.
ModelShape model_shape(const Deck& d) {
  ModelShape s = resolve_model_shape(d.model);
  const std::string path = llmc_init_path(d);
  if (path.empty()) return s;
  const LlmcHeader h = read_llmc_header(path);
  if (d.model.max_seq_len == 0) s.max_seq_len = h.max_seq_len;
  if (d.model.padded_vocab_size == 0) s.padded_vocab = h.padded_vocab_size;
  check_llmc_shape(h, s, path);
  return s;
}

BlockTable block_table(const ParamCatalog& cat, const Deck& d) {
  BlockTable t;
  for (const BlockInfo& b : cat.blocks())
    t.blocks.push_back(BlockDesc{b.numel(), cat.tensor(b.tensor).weight_decay, cat.block_name(b)});
  const double init_std = d.model.init_std;
  const auto seed = static_cast<std::uint64_t>(d.run.seed);
  if (const std::string path = llmc_init_path(d); !path.empty()) {
    // Read once per process, on the first block asked for (only ranks that hold parameters).
    auto canonical = std::make_shared<std::vector<float>>();
    t.init = [&cat, path, canonical](int id, float* out) {
      if (canonical->empty()) read_llmc_params(path, cat, *canonical);
      cat.gather_block(cat.block(id), canonical->data(), out);
    };
  } else {
    t.init = [&cat, init_std, seed](int id, float* out) {
      cat.init_block(cat.block(id), init_std, seed, out);
    };
  }
  t.canonical_crc = [&cat](const std::vector<const float*>& data) {
    std::vector<float> flat(static_cast<std::size_t>(cat.total_numel()));
    for (const BlockInfo& b : cat.blocks()) cat.scatter_block(b, data[b.id], flat.data());
    return crc32c(flat.data(), flat.size() * sizeof(float));
  };
  return t;
}

// Blocks go to holders near the compute ranks that fetch them (one per position: replica 0).
std::vector<int> place_blocks_on_holders(const Setup& s, const std::vector<StagePosition>& stages) {
  std::vector<std::int64_t> bytes;
  for (const BlockInfo& b : s.catalog->blocks()) bytes.push_back(b.bytes());
  std::vector<Fetcher> fetchers;
  for (const StagePosition& pos : stages)
    fetchers.push_back({s.node[s.shape.fetcher_rank(pos.pp, pos.tp)], pos.shapes.needed_blocks()});
  const std::vector<int> holder_node(s.node.begin(), s.node.begin() + s.shape.holders);
  return place_near_fetchers(bytes, fetchers, holder_node);
}

void check_every_holder_owns_a_block(const Deck& deck, const Setup& s) {
  std::vector<int> owned(static_cast<std::size_t>(s.shape.holders), 0);
  for (int o : s.owner) ++owned[o];
  for (int h = 0; h < s.shape.holders; ++h)
    if (owned[h] == 0)
      throw Error(ExitCode::layout,
                  deck.where("parallel.holders") + ": holder " + std::to_string(h) +
                      " would own no parameter block (the model has " +
                      std::to_string(s.owner.size()) + " blocks); use fewer holders");
}

// pd.cache_mb must hold the largest single use of every compute rank's stage (a layer, or the
// tied embedding with the final LayerNorm); less could never run.
void check_cache_size(const Deck& deck, const std::vector<StagePosition>& stages) {
  const auto capacity = static_cast<std::int64_t>(deck.pd.cache_mb * 1048576.0);
  for (const StagePosition& pos : stages) {
    const std::int64_t need = ParamCache::min_capacity_bytes(
        StageCache::units_of(pos.shapes), StageCache::layer_major_plan(pos.shapes));
    if (capacity < need) {
      char mib[32], have[32];
      std::snprintf(mib, sizeof(mib), "%.2f", static_cast<double>(need) / 1048576.0);
      std::snprintf(have, sizeof(have), "%g", deck.pd.cache_mb);
      throw Error(ExitCode::deck,
                  deck.where("pd.cache_mb") + ": " + have + " MiB cannot hold one use of pipeline stage " + std::to_string(pos.pp) +
                      " (tp rank " + std::to_string(pos.tp) + "): its largest (a layer, or the tied "
                      "embedding with the final LayerNorm) needs " + mib + " MiB");
    }
  }
}

}  // namespace

Setup make_setup(const Deck& deck, MPI_Comm job, bool eval_only) {
  int world_size = 0;
  MPI_CHECK(MPI_Comm_size(job, &world_size));
  Setup s;
  s.shape = resolve_layout(deck, world_size);
  s.catalog = std::make_unique<ParamCatalog>(model_shape(deck));
  s.table = block_table(*s.catalog, deck);
  const std::vector<int> job_node = node_of_ranks(job);
  s.job_rank = spread_holders(s.shape.holders, job_node);
  for (int r : s.job_rank) s.node.push_back(job_node[r]);
  if (s.shape.holders > 0) {
    const std::vector<StagePosition> stages = stage_positions(deck, s.shape, *s.catalog);
    s.owner = place_blocks_on_holders(s, stages);
    check_every_holder_owns_a_block(deck, s);
    if (deck.pd.cache_mb > 0) check_cache_size(deck, stages);
  }
  // Every rank opens the data so that a bad file is one collective error, not a hang.
  data::SourceSpec spec = source_spec(deck);
  if (eval_only && spec.kind != data::SourceKind::synthetic) spec.val_path = spec.path;
  s.source = data::make_token_source(spec);
  return s;
}

StageSpec stage_spec(const Deck& deck, const LayoutShape& shape, int p, int t) {
  const std::int64_t L = deck.model.n_layer, pp = shape.pp;
  return StageSpec{p * L / pp, (p + 1) * L / pp, p == 0, p == pp - 1, shape.tp, t};
}

StageSpec stage_spec(const Deck& deck, const Layout& layout) {
  return stage_spec(deck, layout.shape(), layout.pp_rank(), layout.tp_rank());
}

std::vector<StagePosition> stage_positions(const Deck& deck, const LayoutShape& shape,
                                           const ParamCatalog& catalog) {
  std::vector<StagePosition> out;
  out.reserve(static_cast<std::size_t>(shape.pp * shape.tp));
  for (int p = 0; p < shape.pp; ++p)
    for (int t = 0; t < shape.tp; ++t)
      out.push_back({p, t, StageParams(catalog, stage_spec(deck, shape, p, t),
                                       StageParams::Storage::shapes_only, precision(deck))});
  return out;
}

AdamWConfig adamw_config(const Deck& d) {
  const OptimizerConfig& o = d.optimizer;
  return AdamWConfig{o.lr,       o.min_lr,    o.warmup_steps, d.run.steps, o.weight_decay,
                     o.grad_clip, o.beta1,    o.beta2,        o.eps};
}

WireCodec fetch_codec(const Deck& deck) {
  return deck.train.precision == "bf16" ? WireCodec::bf16
                                        : *wire_codec_from_string(deck.pd.fetch_codec);
}

Precision precision(const Deck& deck) {
  return deck.train.precision == "bf16" ? Precision::bf16 : Precision::fp32;
}

Recompute recompute_mode(const Deck& deck) {
  if (deck.train.recompute == "full") return Recompute::full;
  if (deck.train.recompute == "attention") return Recompute::attention;
  return Recompute::none;
}

StageOrder stage_order(const Deck& deck) {
  return deck.parallel.order == "layer" ? StageOrder::layer : StageOrder::micro_batch;
}

int activation_slots(const Deck& deck, const LayoutShape& shape, int pp_rank) {
  const int m = static_cast<int>(deck.parallel.micro_batches);
  if (stage_order(deck) == StageOrder::layer) return m;
  return pipeline_in_flight(*pipeline_kind_from_string(deck.parallel.schedule), shape.pp, pp_rank,
                            m);
}

int backward_passes(const Deck& deck) {
  return stage_order(deck) == StageOrder::layer ? 1 : static_cast<int>(deck.parallel.micro_batches);
}

std::int64_t micro_batch_size(const Deck& deck, const LayoutShape& shape) {
  return deck.train.batch_size / (shape.dp * deck.parallel.micro_batches);
}

std::vector<int> push_contributions(const ParamCatalog& cat, int pp) {
  std::vector<int> n(cat.blocks().size(), 1);
  for (const BlockInfo& b : cat.blocks())
    if (b.tensor == TensorId::wte && pp > 1) n[b.id] = 2;
  return n;
}

}  // namespace pdtrain
