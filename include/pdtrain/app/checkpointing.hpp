#pragma once
// Wiring of HDF5 checkpoints into a run: where a restart starts from, reading the restart state
// for any layout, and the hooks that write checkpoints from the holders (or, in the replicated
// baseline, from compute rank 0).
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/layout/layout.hpp"
#include "pdtrain/pd/holder_server.hpp"

namespace pdtrain {

struct RestartPoint {
  std::string path;  // empty: a fresh start
  std::int64_t step = 0, version = 0;
  bool lossy = false;  // a bitdelta checkpoint: parameters are approximate
};

// Collective over `world`: `restart` is "" or "fresh" (step 0, whatever checkpoint.dir holds),
// "auto" (the newest complete, valid checkpoint in checkpoint.dir, or fresh if it holds none;
// damaged newer ones are skipped with a warning; checkpoints present but none valid is a data
// error naming each) or a path. Errors are the same on every rank.
RestartPoint resolve_restart(const Deck& deck, const std::string& restart, MPI_Comm world);

// Collective over `comm` (the holders, or MPI_COMM_SELF): the state of `ids` at the restart point.
std::map<int, BlockState> read_restart_state(const RestartPoint& rp, const ParamCatalog& cat,
                                             MPI_Comm comm, const std::vector<int>& ids);

// Hooks that write checkpoints every checkpoint.every steps and at the end of the run.
// `writer` must outlive the run.
HolderHooks checkpoint_hooks(ckpt::CheckpointWriter& writer, const Deck& deck,
                             const std::string& layout_text, std::int64_t tokens_per_step,
                             bool verbose);

}  // namespace pdtrain
