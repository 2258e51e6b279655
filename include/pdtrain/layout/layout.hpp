#pragma once
// Rank roles and communicators. The job's communicator splits into holder ranks (the first
// `holders` ranks) and compute ranks; compute ranks form a Cartesian dp x pp x tp grid (tp
// fastest, so a tensor-parallel group sits on adjacent ranks, usually one node).
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"

namespace pdtrain {

struct LayoutShape {
  int holders = 0, dp = 1, tp = 1, pp = 1;
  int compute() const { return dp * tp * pp; }
  int world() const { return holders + compute(); }
  // The rank of data-parallel replica d's compute rank at pipeline stage p, tensor rank t:
  // compute ranks follow the holders, tp fastest.
  int compute_rank(int d, int p, int t) const { return holders + (d * pp + p) * tp + t; }
  // The rank that fetches the blocks of pipeline stage p, tensor rank t from the holders:
  // data-parallel replica 0 (it relays them to the other replicas).
  int fetcher_rank(int p, int t) const { return compute_rank(0, p, t); }
};

// Resolves dp = 0 (auto) and checks that the layout fits `world_size` and the model.
// Throws Error(ExitCode::layout, ...) naming the deck line of the key to change.
LayoutShape resolve_layout(const Deck& deck, int world_size);

class Layout {
 public:
  Layout(const LayoutShape& shape, MPI_Comm world);
  ~Layout();
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;

  const LayoutShape& shape() const { return shape_; }
  MPI_Comm world() const { return world_; }  // private duplicate of the job communicator
  int world_rank() const { return world_rank_; }
  bool is_holder() const { return holder_index_ >= 0; }
  bool replicated() const { return shape_.holders == 0; }  // the replicated baseline
  int holder_index() const { return holder_index_; }
  int compute_index() const { return compute_index_; }
  int dp_rank() const { return coords_[0]; }
  int pp_rank() const { return coords_[1]; }
  int tp_rank() const { return coords_[2]; }

  MPI_Comm holders_comm() const { return holders_comm_; }  // MPI_COMM_NULL on compute ranks
  MPI_Comm compute_comm() const { return compute_comm_; }  // MPI_COMM_NULL on holders
  MPI_Comm dp_comm() const { return dp_comm_; }
  MPI_Comm pp_comm() const { return pp_comm_; }
  MPI_Comm tp_comm() const { return tp_comm_; }
  // The compute ranks of this rank's data-parallel replica (every pp x tp position of its dp
  // index; rank pp * tp + tp_rank): one copy of the whole model in the replicated baseline.
  MPI_Comm replica_comm() const { return replica_comm_; }

  int holder_world_rank(int h) const { return h; }
  int compute_world_rank(int dp, int pp, int tp) const { return shape_.compute_rank(dp, pp, tp); }
  // The compute rank that reports (prints, writes metrics): dp 0, tp 0, last pipeline stage.
  int reporter_world_rank() const { return compute_world_rank(0, shape_.pp - 1, 0); }
  bool is_reporter() const { return world_rank_ == reporter_world_rank(); }

  // One line per world rank: role and coordinates (for --dry-run).
  std::string describe_rank(int world_rank) const;

 private:
  LayoutShape shape_;
  MPI_Comm world_ = MPI_COMM_NULL;
  int world_rank_ = 0;
  int holder_index_ = -1, compute_index_ = -1;
  int coords_[3] = {-1, -1, -1};
  MPI_Comm holders_comm_ = MPI_COMM_NULL, compute_comm_ = MPI_COMM_NULL;
  MPI_Comm dp_comm_ = MPI_COMM_NULL, pp_comm_ = MPI_COMM_NULL, tp_comm_ = MPI_COMM_NULL;
  MPI_Comm replica_comm_ = MPI_COMM_NULL;
};

// The node (0, 1, ... in order of first rank) of every rank of `comm`, from
// MPI_Comm_split_type(shared), or as test_hooks::ranks_per_node() pretends.
std::vector<int> node_of_ranks(MPI_Comm comm);

}  // namespace pdtrain
