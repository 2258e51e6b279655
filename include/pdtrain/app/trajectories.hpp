#pragma once
// Parameter trajectories (output.trajectory_every = N): after every N-th update, each tensor's
// parameter norm ||p||, update norm ||p - p_prev|| (the step's whole change: AdamW and weight
// decay) and their ratio, per layer, appended to OUT/trajectories.csv as
//   step,tensor,param_norm,update_norm,update_to_weight
// Each holder sums squares over the blocks it owns (a copy of those blocks is kept from the
// update before), and the holders gather their per-tensor sums on holder 0, which adds them in
// holder order and writes: no parameter crosses the network.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/io/output_file.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/pd/holder_server.hpp"

namespace pdtrain {

class TrajectoryRecorder {
 public:
  // `holders`: the communicator of the ranks that own blocks (MPI_COMM_SELF for the baseline's
  // one writer); its rank 0 writes `path`: a run restarted at `resume_step` > 0 keeps the rows
  // of steps up to it (as metrics.csv), a fresh run starts the file anew.
  TrajectoryRecorder(const ParamCatalog& cat, std::int64_t every, MPI_Comm holders,
                     const std::string& path, std::int64_t resume_step = 0);
  // Collective over `holders`: called after every update, with all of them at `version`.
  void after_update(std::int64_t version, const HolderHooks::BlocksGetter& blocks);

  // Wraps `hooks`' after_update so that it records first.
  static HolderHooks with_trajectories(HolderHooks hooks, std::shared_ptr<TrajectoryRecorder> r);

 private:
  void write_rows(std::int64_t version, const std::vector<double>& sums);

  const ParamCatalog& cat_;
  std::int64_t every_;
  std::int64_t resume_step_;
  MPI_Comm holders_;
  std::string path_;
  std::unique_ptr<OutputFile> out_;
  std::vector<std::string> names_;  // one per (tensor, layer): "h.3.qkvw", "wte"
  std::vector<int> row_of_block_;   // block id -> its (tensor, layer) row
  std::map<int, std::vector<float>> previous_;  // owned blocks at version - 1
  std::int64_t previous_version_ = -1;
};

}  // namespace pdtrain
