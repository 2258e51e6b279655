#pragma once
// What every rank builds the same way from the deck before roles diverge (Setup), and the
// deck's settings as the parts take them: the optimizer's, the wire's, each stage's.
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pdtrain/data/token_source.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/device_replica.hpp"
#include "pdtrain/pd/staleness.hpp"
#include "pdtrain/pd/wire_codec.hpp"

namespace pdtrain {

struct Setup {
  LayoutShape shape;
  std::unique_ptr<ParamCatalog> catalog;
  BlockTable table;
  std::vector<int> owner;     // holder of each block (PD only)
  std::vector<int> node;      // node of every rank (in PD order, see spread_holders)
  std::vector<int> job_rank;  // PD-ordered rank -> rank in the job's communicator
  std::unique_ptr<data::TokenSource> source;
};

// Collective over `job` (nodes of its ranks). Throws pdtrain::Error for a bad layout, model or
// data file; every rank of the job throws alike only if the caller agrees on it (core/agreement).
// `eval_only`: the validation windows are those of data.path itself, from its first token (how
// llm.c computes a validation loss over a file).
Setup make_setup(const Deck& deck, MPI_Comm job, bool eval_only);

// The checks make_setup makes of a layout before it builds anything (what a rank would need;
// with holders: every holder owns a block, pd.cache_mb holds every stage's largest use), for a
// job whose rank r runs on node job_node[r]. Throws the Error make_setup throws (status and
// message). `pdtrain plan` refuses a layout with these (plan::PlanOptions::check_layout).
void check_layout(const Deck& deck, const LayoutShape& shape, const std::vector<int>& job_node);

// The stage of the compute rank at pipeline stage p, tensor-parallel rank t: its contiguous,
// balanced range of layers, the embedding on the first stage, the final LayerNorm and tied head
// on the last, and its tensor-parallel shard.
StageSpec stage_spec(const Deck& deck, const LayoutShape& shape, int p, int t);
StageSpec stage_spec(const Deck& deck, const Layout& layout);

// A compute position of the grid (pipeline stage, tensor rank; every data-parallel replica has
// the same) and the shapes of its stage's parameters, without storage.
struct StagePosition {
  int pp = 0, tp = 0;
  StageParams shapes;
};
// Every position, in rank order (pp major, tp fastest), for `catalog` (which must outlive them).
std::vector<StagePosition> stage_positions(const Deck& deck, const LayoutShape& shape,
                                           const ParamCatalog& catalog);

// The replicated baseline's part of the model on this compute rank: its stage shard's blocks
// (the ones PD would fetch for it), the ones it counts (each block of the model on one rank of
// the replica: the tied embedding on the first stage, blocks replicated over the tensor group
// on tp rank 0), the replica's communicator, and where the final CRC goes.
ReplicaShard replica_shard(const Deck& deck, const ParamCatalog& catalog, const Layout& layout);

AdamWConfig adamw_config(const Deck& deck);
// The fetch codec in use: bf16 precision makes holders serve bf16 copies of their fp32 masters.
WireCodec fetch_codec(const Deck& deck);
// Bounded staleness as the deck sets it (pd.staleness, its warm-up and correction, and the
// evaluation steps, whose versions are served exactly).
StalenessPlan staleness_plan(const Deck& deck);
Recompute recompute_mode(const Deck& deck);
// Activation sets a stage keeps: the micro-batches in flight under the pipeline schedule, or
// every micro-batch in layer-major order.
int activation_slots(const Deck& deck, const LayoutShape& shape, int pp_rank);
// Backward passes of a stage per step, as gradient writes go: one per micro-batch, or one in
// layer-major order (all micro-batches per section).
int backward_passes(const Deck& deck);
std::int64_t micro_batch_size(const Deck& deck, const LayoutShape& shape);
// How many gradient pushes of each block make up one step: the tied embedding is used (and
// pushed) by both the first and the last pipeline stage; every other block by one stage.
std::vector<int> push_contributions(const ParamCatalog& cat, int pp);

}  // namespace pdtrain
