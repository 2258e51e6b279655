#pragma once
// Runs a deck on a communicator and shares the reporter's results with every rank of it, so
// that expectations hold on any rank.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/app/train.hpp"

namespace pdtrain::test {

struct RunOutcome {
  std::vector<double> losses;
  std::uint32_t crc = 0;
};

// Shares `r` of rank `root` with every rank of `comm`.
inline void share(RunOutcome& r, int root, MPI_Comm comm) {
  int n = static_cast<int>(r.losses.size());
  MPI_Bcast(&n, 1, MPI_INT, root, comm);
  r.losses.resize(static_cast<std::size_t>(n));
  MPI_Bcast(r.losses.data(), n, MPI_DOUBLE, root, comm);
  MPI_Bcast(&r.crc, 1, MPI_UINT32_T, root, comm);
}

inline RunOutcome run_deck(const std::string& deck_text, const std::vector<std::string>& sets,
                           MPI_Comm comm, RunOptions opts = {}) {
  const Deck deck = parse_deck(deck_text, "test.toml", sets);
  opts.verbose = false;
  const TrainResult r = run_training(deck, comm, opts);
  // The reporter is the compute rank (dp 0, tp 0, last stage).
  const int reporter = static_cast<int>(deck.parallel.holders + (deck.parallel.pp - 1) * deck.parallel.tp);
  RunOutcome out;
  out.losses = r.losses;
  out.crc = r.params_crc32c;
  share(out, reporter, comm);
  return out;
}

// A communicator of `size` consecutive ranks of `comm` containing this rank (the last group
// may be smaller); ranks beyond the last full group get MPI_COMM_NULL.
inline MPI_Comm group_of(MPI_Comm comm, int size) {
  int rank = 0, world = 0;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  const int color = rank / size < world / size ? rank / size : MPI_UNDEFINED;
  MPI_Comm out;
  MPI_Comm_split(comm, color, rank, &out);
  return out;
}

// The deck run by world rank 0 alone (the single-rank reference), shared with every rank.
inline RunOutcome single_rank_run(const std::string& deck_text,
                                  const std::vector<std::string>& sets) {
  MPI_Comm one = group_of(MPI_COMM_WORLD, 1);
  RunOutcome r;
  if (one != MPI_COMM_NULL) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (rank == 0) r = run_deck(deck_text, sets, one);
    MPI_Comm_free(&one);
  }
  share(r, 0, MPI_COMM_WORLD);
  return r;
}

}  // namespace pdtrain::test
