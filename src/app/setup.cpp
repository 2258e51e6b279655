// The set-up every rank does alike: layout, catalogue, block table and placement, data source.
#include "pdtrain/app/setup.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>

#include "pdtrain/app/model_init.hpp"
#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/core/checked_int.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/deck/schema.hpp"
#include "pdtrain/layout/placement.hpp"
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

// The deck's model. run_training completed it from model.init's file (with_model_of_init);
// the check keeps a caller that did not from building stages of another shape than the file's.
ModelShape model_shape(const Deck& d) {
  if (!(with_model_of_init(d).model == d.model))
    throw Error(ExitCode::runtime, "make_setup: the deck's model was not completed from " +
                                       d.model.init + " (with_model_of_init)");
  return resolve_model_shape(d.model);
}

// ---------------------------------------------------------------------------------------------
// What a rank would need, before anything is built. Every size is computed with
// CheckedInt, so a deck cannot wrap a count into something small or negative. The rule: no
// rank may need more than kMaxRankBytes (16 TiB, beyond the memory of any node built today),
// and the catalogue may have at most kMaxBlocks blocks (block ids are ints, each block has a
// version, CRC and entry in every table). The estimates are lower bounds, so a deck they
// refuse could never run; the dry run then reports the exact figures of one that passes.
constexpr std::int64_t kMaxRankBytes = std::int64_t{1} << 44;
constexpr std::int64_t kMaxBlocks = std::int64_t{1} << 24;

// Of the keys a size grows with, the one furthest above its default: the likely mistake.
std::string most_inflated(const Deck& d, std::initializer_list<const char*> keys) {
  const char* best = *keys.begin();
  double best_ratio = 0;
  for (const char* k : keys) {
    const deck::KeySpec& spec = *deck::find_key(k);
    const auto value = static_cast<double>(std::get<std::int64_t>(spec.get(d)));
    const auto base = static_cast<double>(std::get<std::int64_t>(deck::default_value(spec)));
    if (const double ratio = value / std::max(1.0, base); ratio > best_ratio)
      best = k, best_ratio = ratio;
  }
  return best;
}

std::string tib(CheckedInt bytes) {
  if (bytes.overflowed()) return "more than 2^63 bytes";
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.1f TiB", static_cast<double>(bytes.value()) / 0x1p40);
  return buf;
}

void refuse_if_over(const Deck& d, CheckedInt need, std::int64_t cap, const std::string& key,
                    const std::string& what) {
  if (!need.overflowed() && need.value() <= cap) return;
  throw Error(ExitCode::deck, d.where(key) + ": " + what);
}

void check_rank_needs(const Deck& d, const ModelShape& m, const LayoutShape& shape) {
  const CheckedInt C = m.d_model, L = m.n_layer, H = m.n_head;
  const CheckedInt params = CheckedInt(m.padded_vocab) * C + CheckedInt(m.max_seq_len) * C +
                            L * (CheckedInt(12) * C * C + CheckedInt(13) * C) + CheckedInt(2) * C;
  const std::string model = "the model (n_layer " + std::to_string(m.n_layer) + ", d_model " +
                            std::to_string(m.d_model) + ", " + std::to_string(m.padded_vocab) +
                            " vocabulary rows, " + std::to_string(m.max_seq_len) + " positions)";
  // Per layer: q, k, v, qkv bias, fc and fc bias by head, plus the projections' column slabs.
  const CheckedInt blocks = L * (CheckedInt(10) * H + CheckedInt(6)) + CheckedInt(2) * H + 2;
  refuse_if_over(d, blocks, kMaxBlocks, most_inflated(d, {"model.n_layer", "model.n_head"}),
                 model + " with " + std::to_string(m.n_head) + " heads has more than " +
                     std::to_string(kMaxBlocks) + " parameter blocks");
  // fp32 value, gradient and AdamW's two moments: on each holder's share, or on every rank of
  // the replicated baseline, which keeps its stage shard (at least 1/(tp pp) of the model).
  const CheckedInt state = ceil_div(CheckedInt(16) * params,
                                    shape.holders > 0 ? shape.holders : shape.tp * shape.pp);
  refuse_if_over(d, state, kMaxRankBytes,
                 most_inflated(d, {"model.n_layer", "model.d_model", "model.padded_vocab_size",
                                   "model.vocab_size", "model.max_seq_len"}),
                 model + " has " + (params.overflowed() ? std::string("more than 2^63")
                                                        : std::to_string(params.value())) +
                     " parameters; with their gradients and AdamW state that is " + tib(state) +
                     " on each " + (shape.holders > 0 ? "holder" : "rank") +
                     ", more than the 16 TiB any rank may need");
  // One micro-batch's logits (fp32) over the compute rank's vocabulary rows.
  const std::int64_t micro = std::max<std::int64_t>(1, micro_batch_size(d, shape));
  const CheckedInt logits =
      ceil_div(CheckedInt(4) * micro * m.seq_len * m.padded_vocab, shape.tp);
  refuse_if_over(d, logits, kMaxRankBytes,
                 most_inflated(d, {"train.batch_size", "model.seq_len", "model.padded_vocab_size",
                                   "model.vocab_size"}),
                 "one micro-batch's logits (" + std::to_string(micro) + " sequences x " +
                     std::to_string(m.seq_len) + " tokens x " + std::to_string(m.padded_vocab) +
                     " vocabulary rows) need " + tib(logits) +
                     " on a compute rank, more than the 16 TiB any rank may need");
}

// ---------------------------------------------------------------------------------------------
// Where the run will write, checked before it starts (and by the dry run) without leaving
// anything behind: a directory that exists must take a file (one is created and removed: as
// root, access() says yes to everything); one that does not must be creatable, which is
// probed by creating and removing a directory in its nearest existing ancestor. Names longer
// than the file system allows are deck errors (status 2), the rest I/O errors (status 4).

// The key a path comes from: a default out_dir is runs/<run.name>, a default checkpoint.dir
// lies under run.out_dir.
std::string key_of_path(const Deck& d, const std::string& key) {
  const auto it = d.origin.find(key);
  const bool derived = it == d.origin.end() || it->second == "default";
  if (!derived) return key;
  return key == "checkpoint.dir" ? key_of_path(d, "run.out_dir") : "run.name";
}

void check_name_lengths(const Deck& d, const std::string& key, const std::filesystem::path& dir) {
  const std::string blamed = key_of_path(d, key);
  const std::size_t path_max = PATH_MAX, name_max = NAME_MAX;
  if (dir.native().size() >= path_max)
    throw Error(ExitCode::deck, d.where(blamed) + ": the directory " + key + " names is " +
                                    std::to_string(dir.native().size()) +
                                    " characters long, longer than a path may be (PATH_MAX " +
                                    std::to_string(path_max) + ")");
  for (const auto& part : dir)
    if (part.native().size() > name_max)
      throw Error(ExitCode::deck,
                  d.where(blamed) + ": " + key + " has a path component of " +
                      std::to_string(part.native().size()) +
                      " characters, longer than a file name may be (NAME_MAX " +
                      std::to_string(name_max) + "): '" + part.native().substr(0, 40) + "...'");
}

[[noreturn]] void unwritable(const Deck& d, const std::string& key, const std::string& dir,
                             const std::string& why) {
  throw Error(ExitCode::data, d.where(key) + ": the run cannot write to '" + dir + "': " + why);
}

void check_writable_dir(const Deck& d, const std::string& key, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::absolute(fs::path(dir)).lexically_normal();
  check_name_lengths(d, key, path);
  fs::path existing = path;
  std::error_code ec;
  while (!fs::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    unwritable(d, key, dir, existing.string() + " exists and is not a directory");
  const bool missing = existing != path;
  std::string probe = (existing / ".pdtrain-probe-XXXXXX").string();
  if (missing) {
    if (::mkdtemp(probe.data()) == nullptr)
      unwritable(d, key, dir, "cannot create a directory in " + existing.string() + ": " +
                                  std::strerror(errno));
    ::rmdir(probe.c_str());
  } else {
    const int fd = ::mkstemp(probe.data());
    if (fd < 0)
      unwritable(d, key, dir, "cannot create a file in it: " + std::string(std::strerror(errno)));
    ::close(fd);
    ::unlink(probe.c_str());
  }
}

// Every rank checks: the ranks that write (rank 0, the reporter, the holders) may sit on
// different nodes, each with its own view of the file system.
void check_output_dirs(const Deck& d) {
  check_writable_dir(d, "run.out_dir", d.run.out_dir);
  check_writable_dir(d, "checkpoint.dir", d.checkpoint.dir);
}

BlockTable block_table(const ParamCatalog& cat, const Deck& d) {
  BlockTable t;
  for (const BlockInfo& b : cat.blocks())
    t.blocks.push_back(BlockDesc{b.numel(), cat.tensor(b.tensor).weight_decay, cat.block_name(b),
                                 cat.forward_need_rank(b)});
  const double init_std = d.model.init_std;
  const auto seed = static_cast<std::uint64_t>(d.run.seed);
  if (const InitFile init = init_file(d); init.kind != InitFile::Kind::none) {
    // Read once per process, on the first block asked for (only ranks that hold parameters;
    // fill_initial_values asks from several threads).
    struct Canonical {
      std::once_flag read;
      std::vector<float> values;
    };
    auto canonical = std::make_shared<Canonical>();
    t.init = [&cat, init, canonical](int id, float* out) {
      std::call_once(canonical->read, [&] { read_init_params(init, cat, canonical->values); });
      cat.gather_block(cat.block(id), canonical->values.data(), out);
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

// Blocks go to holders near the compute ranks that fetch them (one per position: replica 0);
// node[r] is the node of layout rank r.
std::vector<int> place_blocks_on_holders(const LayoutShape& shape, const ParamCatalog& cat,
                                         const std::vector<int>& node,
                                         const std::vector<StagePosition>& stages) {
  std::vector<std::int64_t> bytes;
  for (const BlockInfo& b : cat.blocks()) bytes.push_back(b.bytes());
  std::vector<Fetcher> fetchers;
  for (const StagePosition& pos : stages)
    fetchers.push_back({node[shape.fetcher_rank(pos.pp, pos.tp)], pos.shapes.needed_blocks()});
  const std::vector<int> holder_node(node.begin(), node.begin() + shape.holders);
  return place_near_fetchers(bytes, fetchers, holder_node);
}

void check_every_holder_owns_a_block(const Deck& deck, int holders, const std::vector<int>& owner) {
  std::vector<int> owned(static_cast<std::size_t>(holders), 0);
  for (int o : owner) ++owned[o];
  for (int h = 0; h < holders; ++h)
    if (owned[h] == 0)
      throw Error(ExitCode::layout,
                  deck.where("parallel.holders") + ": holder " + std::to_string(h) +
                      " would own no parameter block (the model has " +
                      std::to_string(owner.size()) + " blocks); use fewer holders");
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

// The holders' blocks (placed near their fetchers; node[r]: the node of layout rank r) and the
// checks a PD layout must pass on them: every holder owns a block, pd.cache_mb holds every
// stage's largest use.
std::vector<int> checked_owners(const Deck& deck, const LayoutShape& shape, const ParamCatalog& cat,
                                const std::vector<int>& node) {
  const std::vector<StagePosition> stages = stage_positions(deck, shape, cat);
  std::vector<int> owner = place_blocks_on_holders(shape, cat, node, stages);
  check_every_holder_owns_a_block(deck, shape.holders, owner);
  if (deck.pd.cache_mb > 0) check_cache_size(deck, stages);
  return owner;
}

// The node of each layout rank (holders first, spread over the nodes: spread_holders), for a
// job whose rank r runs on job_node[r]; `job_rank` receives the job rank of each layout rank.
std::vector<int> layout_nodes(int holders, const std::vector<int>& job_node, std::vector<int>* job_rank) {
  *job_rank = spread_holders(holders, job_node);
  std::vector<int> node;
  for (int r : *job_rank) node.push_back(job_node[static_cast<std::size_t>(r)]);
  return node;
}

}  // namespace

void check_layout(const Deck& deck, const LayoutShape& shape, const std::vector<int>& job_node) {
  const ModelShape model = resolve_model_shape(deck.model);
  check_rank_needs(deck, model, shape);
  if (shape.holders == 0) return;
  const ParamCatalog catalog(model);
  std::vector<int> job_rank;
  checked_owners(deck, shape, catalog, layout_nodes(shape.holders, job_node, &job_rank));
}

Setup make_setup(const Deck& deck, MPI_Comm job, bool eval_only) {
  int world_size = 0;
  MPI_CHECK(MPI_Comm_size(job, &world_size));
  Setup s;
  s.shape = resolve_layout(deck, world_size);
  if (!eval_only) check_output_dirs(deck);
  const ModelShape model = model_shape(deck);
  check_rank_needs(deck, model, s.shape);
  s.catalog = std::make_unique<ParamCatalog>(model);
  s.table = block_table(*s.catalog, deck);
  s.node = layout_nodes(s.shape.holders, node_of_ranks(job), &s.job_rank);
  if (s.shape.holders > 0) s.owner = checked_owners(deck, s.shape, *s.catalog, s.node);
  // Every rank opens the data so that a bad file is one collective error, not a hang.
  data::SourceSpec spec = source_spec(deck);
  if (eval_only && spec.kind != data::SourceKind::synthetic) spec.val_path = spec.path;
  s.source = data::make_token_source(spec);
  return s;
}

StageSpec stage_spec(const Deck& deck, const LayoutShape& shape, int p, int t) {
  return split_stage(deck.model.n_layer, shape.pp, p, shape.tp, t);
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
                                       StageParams::Storage::shapes_only, deck.train.precision)});
  return out;
}

ReplicaShard replica_shard(const Deck& deck, const ParamCatalog& catalog, const Layout& layout) {
  const StageParams stage(catalog, stage_spec(deck, layout), StageParams::Storage::shapes_only,
                          deck.train.precision);
  ReplicaShard shard;
  shard.kept = stage.needed_blocks();
  const bool first_stage = layout.pp_rank() == 0;
  for (int b : shard.kept) {
    const BlockInfo& info = catalog.block(b);
    // The tied embedding is counted where it is looked up; the head's stage sums its gradient in.
    if (stage.pushes(info) && (info.tensor != TensorId::wte || first_stage))
      shard.counted.push_back(b);
  }
  if (layout.shape().tp * layout.shape().pp > 1) {
    shard.replica = layout.replica_comm();
    // The reporter (dp 0, tp 0, last stage) prints the CRC: rank (pp - 1) * tp of replica 0.
    shard.crc_root = layout.dp_rank() == 0 ? (layout.shape().pp - 1) * layout.shape().tp : -1;
  }  // alone, every replica has every block and computes the CRC itself
  return shard;
}

AdamWConfig adamw_config(const Deck& d) {
  const OptimizerConfig& o = d.optimizer;
  return AdamWConfig{o.lr,       o.min_lr,    o.warmup_steps, d.run.steps, o.weight_decay,
                     o.grad_clip, o.beta1,    o.beta2,        o.eps};
}

StalenessPlan staleness_plan(const Deck& deck) {
  StalenessPlan plan;
  plan.staleness = static_cast<int>(deck.pd.staleness);
  plan.warmup = deck.pd.staleness_warmup;
  plan.ramp = deck.pd.staleness_ramp;
  plan.correction = deck.pd.stale_correction == "predict" ? StaleCorrection::predict
                    : deck.pd.stale_correction == "trend" ? StaleCorrection::trend
                                                          : StaleCorrection::none;
  plan.eval_every = deck.train.eval_every;
  plan.last_step = deck.run.steps;
  return plan;
}

WireCodec fetch_codec(const Deck& deck) {
  return deck.train.precision == Precision::bf16 ? WireCodec::bf16
                                        : *wire_codec_from_string(deck.pd.fetch_codec);
}

Recompute recompute_mode(const Deck& deck) {
  if (deck.train.recompute == "full") return Recompute::full;
  if (deck.train.recompute == "attention") return Recompute::attention;
  return Recompute::none;
}

int activation_slots(const Deck& deck, const LayoutShape& shape, int pp_rank) {
  const int m = static_cast<int>(deck.parallel.micro_batches);
  if (deck.parallel.order == StageOrder::layer) return m;
  return pipeline_in_flight(*pipeline_kind_from_string(deck.parallel.schedule), shape.pp, pp_rank,
                            m);
}

int backward_passes(const Deck& deck) {
  return deck.parallel.order == StageOrder::layer ? 1 : static_cast<int>(deck.parallel.micro_batches);
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
