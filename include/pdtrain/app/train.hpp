#pragma once
// One training run on a communicator: the whole job in the binary, a sub-communicator in the
// tests. Holders serve; compute ranks run the step loop; the reporter prints and writes metrics.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/deck.hpp"

namespace pdtrain {

struct RunOptions {
  bool dry_run = false;   // print the layout and exit
  bool verbose = true;    // per-step lines and the header on stdout
  std::int64_t eval_batches = 0;  // > 0: evaluate the initial model on that many batches, no training
  std::string restart;  // "" or "fresh": step 0; "auto": newest valid checkpoint; or a path
  std::int64_t stop_after = 0;    // > 0: end after this step with a checkpoint
  // Batches (by index: step s trains on batch s unless some are skipped) that rewinds skipped
  // (train.on_divergence = rewind), ascending; steps train on the batches left, in order.
  std::vector<std::int64_t> skipped_batches;
};

struct TrainResult {
  bool reporter = false;            // the fields below are filled on the reporting rank only
  std::vector<double> losses;       // training loss of steps 1..N
  std::vector<double> val_losses;   // NaN where not evaluated
  std::uint32_t params_crc32c = 0;  // CRC32C of all parameters in canonical order
  std::int64_t final_step = 0;      // the last step run (the checkpoint's step)
  bool stopped = false;             // ended early by a signal
  std::int64_t diverged_step = 0;   // > 0: training diverged at this step (every compute rank)
  std::string divergence;           // why, on the ranks that saw it (exit status 5)
  double wall_seconds = 0.0;
};

// Throws pdtrain::Error (the same on every rank of `world`) for bad layouts or data, and
// ExitCode::diverged when training diverged (after train.max_rewinds rewinds, with rewind).
TrainResult run_training(const Deck& deck, MPI_Comm world, const RunOptions& opts);

// The batch step `step` trains on: the step-th batch not in `skipped` (ascending).
std::int64_t batch_of_step(std::int64_t step, const std::vector<std::int64_t>& skipped);

}  // namespace pdtrain
