#pragma once
// `pdtrain plan`: the performance model's prediction for a deck, printed; `--search` ranks the
// layouts of a rank or GPU count; `--calibrate` measures this machine into a machine file.
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/plan/machine.hpp"
#include "pdtrain/plan/model.hpp"

namespace pdtrain::plan {

struct PlanOptions {
  std::string machine;  // a machine file, or the name of one in machines/ ("a100-80gb")
  int nodes = 0;        // 0: from --ranks (or the deck's layout)
  int ranks = 0;        // the job's ranks, holders included; 0: from --nodes (or the deck)
  bool search = false;
  // --largest (with --search): the largest GPT of the deck's family that fits the job's GPUs,
  // with parameter holders and as the replicated baseline (largest_models).
  bool largest = false;
  // GPU-direct collectives whatever the deck's parallel.comm says (what if a run took NCCL);
  // without it the deck's parallel.comm decides (docs/performance-model.md, "Inputs").
  bool nccl = false;
  std::string calibrate;  // --calibrate OUT.toml: measure this machine, write OUT.toml
  // What training knows and plan/ cannot see (app/ depends on plan/), handed in by
  // pdtrain::connect_plan_to_training (main, the tests):
  // a PD layout's gradient bytes per stage (GradStreamer's bound), required for PD layouts;
  std::function<std::function<double(int)>(const Deck&, const LayoutShape&)> pd_grad_bytes;
  // the set-up's layout checks for a job whose rank r runs on node job_node[r]: throws the
  // Error training's set-up would (app's check_layout).
  std::function<void(const Deck&, const LayoutShape&, const std::vector<int>& job_node)> check_layout;
};

// --search: one layout of the deck (holders, tp, pp, micro-batches, recomputation varied; dp
// what the ranks leave) and its prediction.
struct RankedLayout {
  PlanInput input;
  Prediction prediction;
  std::string recompute;
};

// Every layout training would accept for the job's ranks (--ranks) or GPUs (--nodes: holders
// are extra CPU processes), predicted: those that fit first, then by predicted tokens/s.
// Throws Error(layout) when there is none.
std::vector<RankedLayout> search_layouts(const Deck& deck, const PlanOptions& options, const Machine& m);

// --search --largest: for each width of the GPT family (d_model 768 to 25600, heads of 64 or
// 128 channels, GPT-3's widths and beyond), the most layers that fit (device and node memory)
// on the same GPUs two ways: with the deck's holders (1 if it has none; pd.cache_mb the
// deck's, raised to the stage's largest use plus one layer where that is more) and as the
// replicated baseline (parallel.holders = 0, the job's GPUs only). The deck gives everything
// else (vocabulary, sequence, batch, precision, recomputation, tp, pp).
struct LargestAtWidth {
  std::int64_t d_model = 0, n_head = 0;
  std::int64_t n_layer = 0;  // 0: not even one layer fits
  double params = 0;         // of the whole model at n_layer
  double cache_mb = 0;       // PD: the cache it was planned with
  PlanInput input;           // at n_layer (when > 0)
  Prediction prediction;
};
struct LargestModels {
  std::vector<LargestAtWidth> pd, baseline;  // one per width, in the family's order
  int holders = 0;                           // PD's
  int gpus = 0;                              // the job's compute ranks
  const LargestAtWidth* largest(bool with_holders) const;  // most parameters; null: none fits
};
LargestModels largest_models(const Deck& deck, const PlanOptions& options, const Machine& m);
// Parameters of the GPT `shape` (all of it, the tied embedding once).
double model_params(const ModelShape& shape);

// The deck's run as `pdtrain plan` models it: the layout resolved for the job's ranks and checked
// as training's set-up checks it (options.check_layout), and the model's input. Throws the
// Error training would for a layout it refuses.
PlanInput checked_input(const Deck& deck, const PlanOptions& options, const Machine& m);

// Every rank of `comm` computes alike (errors are the same on all, for run_collectively);
// rank 0 prints. Throws Error(layout) after printing when the layout does not fit a device or
// a node, naming the rank and what overflows; Error(deck) for a bad machine file or option.
void run_plan(const Deck& deck, const PlanOptions& options, MPI_Comm comm);

// Measures this machine (collective over `comm`: MPI latency and bandwidth need two ranks)
// and writes the machine file `out` on rank 0.
void calibrate(const std::string& out, MPI_Comm comm);

}  // namespace pdtrain::plan
