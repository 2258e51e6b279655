#pragma once
// What a run prints and writes for people: the dry run's table, the reporter's header before the
// first step, a step's metrics.csv row and line, the summary at the end, the evaluation result.
#include <cstdint>
#include <functional>
#include <string>

#include "pdtrain/app/parameter_step.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/app/train.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/io/metrics.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/plan/command.hpp"

namespace pdtrain {

// "1.5 MiB": binary units, one decimal.
std::string human_bytes(double bytes);

// The PD gradient bytes of each stage's tensor rank 0 as GradStreamer holds them (its replay of
// one step): what `pdtrain plan` counts (main hands it to the plan model) and the dry run prints.
std::function<double(int pp)> pd_grad_bound(const Deck& deck, const LayoutShape& shape);

// Hands `pdtrain plan` what it takes from training: pd_grad_bound and the set-up's layout
// checks (check_layout), so that it counts what a run holds and refuses what a run refuses.
void connect_plan_to_training(plan::PlanOptions& options);

// --dry-run: the layout, then each rank's role, blocks and memory.
void print_dry_run(const Deck& deck, const Setup& setup, const Layout& layout);

// The reporter's header: version, ranks, model, batch, wire codecs, the compute backend (its
// device and kernels), data and output directory.
// `comm`: the transport of compute-to-compute traffic and why (CommChoice::why), shown when
// there is more than one compute rank.
void print_run_header(const Deck& deck, const Setup& setup, const Layout& layout,
                      const std::string& compute, const std::string& comm);

// Step `rec`: its metrics.csv row, and on stdout (verbose) the line of the first, the last and
// every run.log_every-th step; `eta` the seconds the run has left.
void report_step(MetricsWriter& metrics, const StepRecord& rec, const Deck& deck, bool verbose,
                 double eta);

// The end of a training run on the reporter: the summary (times, bytes moved), the parameter
// cache's and the streamed gradients' lines (PD), and `final step=... loss=... params_crc32c=...`.
// On a GPU also the most device memory the rank held.
void print_run_summary(const Deck& deck, const TrainResult& result, std::int64_t start_step,
                       const PhaseTimers& timers, const ParameterFigures& figures,
                       std::int64_t stage_bytes, const Device& device);

// `pdtrain eval`: the mean validation loss over `batches` batches and the parameters' CRC.
void print_eval_result(const Deck& deck, std::int64_t batches, double loss, std::uint32_t crc);

}  // namespace pdtrain
