#include "pdtrain/layout/layout.hpp"

#include <algorithm>
#include <optional>
#include <sstream>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/test_hooks.hpp"

namespace pdtrain {

namespace {
[[noreturn]] void layout_error(const Deck& deck, const std::string& key, const std::string& why) {
  throw Error(ExitCode::layout, deck.where(key) + ": " + why);
}
}  // namespace

LayoutShape resolve_layout(const Deck& deck, int world_size) {
  const ParallelConfig& p = deck.parallel;
  LayoutShape s;
  s.holders = static_cast<int>(p.holders);
  s.tp = static_cast<int>(p.tp);
  s.pp = static_cast<int>(p.pp);
  if (deck.model.n_head % s.tp != 0) {
    std::ostringstream m;
    m << "parallel.tp = " << s.tp << " does not divide model.n_head = " << deck.model.n_head
      << " (tensor parallelism splits attention heads)";
    layout_error(deck, "parallel.tp", m.str());
  }
  if (s.pp > deck.model.n_layer) {
    std::ostringstream m;
    m << "parallel.pp = " << s.pp << " stages for model.n_layer = " << deck.model.n_layer
      << " layers: every stage needs at least one layer";
    layout_error(deck, "parallel.pp", m.str());
  }
  if (deck.parallel.order == StageOrder::layer && s.pp > 1) {
    std::ostringstream m;
    m << "parallel.order = \"layer\" runs every micro-batch through a layer before the next, "
         "which needs the whole model on one stage, but parallel.pp = "
      << s.pp << " (use parallel.schedule for pipelines)";
    layout_error(deck, "parallel.order", m.str());
  }
  if (s.holders == 0 && deck.pd.staleness > 0)
    layout_error(deck, "pd.staleness",
                 "bounded staleness needs parameter holders (parallel.holders >= 1)");
  // Rank counts in 64 bits: the deck bounds each key (parallel.* <= 2^20), not their product.
  const std::int64_t grid = std::int64_t{s.tp} * s.pp;
  const int compute = world_size - s.holders;
  if (compute < 1) {
    std::ostringstream m;
    m << "parallel.holders = " << s.holders << " leaves no compute rank in a job of " << world_size
      << " rank(s); launch at least " << s.holders + grid
      << " ranks (e.g. mpirun -np " << s.holders + 2 << ") or set parallel.holders = 0";
    layout_error(deck, "parallel.holders", m.str());
  }
  if (p.dp == 0) {
    if (compute % grid != 0) {
      std::ostringstream m;
      m << "parallel.dp = 0 (auto): the " << compute << " compute rank(s) left after "
        << s.holders << " holder(s) are not a multiple of tp*pp = " << grid;
      layout_error(deck, "parallel.dp", m.str());
    }
    s.dp = static_cast<int>(compute / grid);
  } else {
    s.dp = static_cast<int>(p.dp);
  }
  if (const std::int64_t needed = s.holders + s.dp * grid; needed != world_size) {
    std::ostringstream m;
    m << "the layout needs holders + dp*tp*pp = " << s.holders << " + " << s.dp << "*" << s.tp
      << "*" << s.pp << " = " << needed << " ranks but the job has " << world_size
      << "; change the rank count or parallel.dp (0 = auto)";
    layout_error(deck, "parallel.dp", m.str());
  }
  const std::int64_t split = s.dp * deck.parallel.micro_batches;
  if (deck.train.batch_size % split != 0) {
    std::ostringstream m;
    m << "train.batch_size = " << deck.train.batch_size << " is not divisible by dp = " << s.dp;
    if (deck.parallel.micro_batches > 1)
      m << " x parallel.micro_batches = " << deck.parallel.micro_batches << " (= " << split << ")";
    layout_error(deck, "train.batch_size", m.str());
  }
  return s;
}

Layout::Layout(const LayoutShape& shape, MPI_Comm world) : shape_(shape) {
  MPI_CHECK(MPI_Comm_dup(world, &world_));
  MPI_CHECK(MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN));
  MPI_CHECK(MPI_Comm_rank(world_, &world_rank_));
  const bool holder = world_rank_ < shape.holders;
  MPI_Comm role_comm;
  MPI_CHECK(MPI_Comm_split(world_, holder ? 0 : 1, world_rank_, &role_comm));
  if (holder) {
    holder_index_ = world_rank_;
    holders_comm_ = role_comm;
    return;
  }
  compute_index_ = world_rank_ - shape.holders;
  const int dims[3] = {shape.dp, shape.pp, shape.tp};
  const int periods[3] = {0, 0, 0};
  MPI_CHECK(MPI_Cart_create(role_comm, 3, dims, periods, 0, &compute_comm_));
  MPI_CHECK(MPI_Comm_free(&role_comm));
  MPI_CHECK(MPI_Cart_coords(compute_comm_, compute_index_, 3, coords_));
  const int keep_dp[3] = {1, 0, 0}, keep_pp[3] = {0, 1, 0}, keep_tp[3] = {0, 0, 1};
  const int keep_replica[3] = {0, 1, 1};
  MPI_CHECK(MPI_Cart_sub(compute_comm_, keep_dp, &dp_comm_));
  MPI_CHECK(MPI_Cart_sub(compute_comm_, keep_pp, &pp_comm_));
  MPI_CHECK(MPI_Cart_sub(compute_comm_, keep_tp, &tp_comm_));
  MPI_CHECK(MPI_Cart_sub(compute_comm_, keep_replica, &replica_comm_));
}

Layout::~Layout() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm* c : {&holders_comm_, &compute_comm_, &dp_comm_, &pp_comm_, &tp_comm_,
                      &replica_comm_, &world_})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

std::string Layout::describe_rank(int r) const {
  std::ostringstream s;
  s << "rank " << r << ": ";
  if (r < shape_.holders) {
    s << "holder " << r;
    return s.str();
  }
  const int c = r - shape_.holders;
  const int tp = c % shape_.tp, pp = (c / shape_.tp) % shape_.pp, dp = c / (shape_.tp * shape_.pp);
  s << "compute " << c << " (dp " << dp << ", pp " << pp << ", tp " << tp << ")";
  if (shape_.holders == 0)
    s << (shape_.tp * shape_.pp > 1 ? ", its stage shard's parameters + optimizer state"
                                     : ", replicated parameters + optimizer state");
  return s.str();
}

std::vector<int> node_of_ranks(MPI_Comm comm) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  int leader = rank;  // the lowest rank of comm on my node
  if (const std::optional<int> per = test_hooks::ranks_per_node()) {
    leader = rank / *per * *per;
  } else {
    MPI_Comm node;
    MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    MPI_Group g_node, g_comm;
    MPI_CHECK(MPI_Comm_group(node, &g_node));
    MPI_CHECK(MPI_Comm_group(comm, &g_comm));
    const int zero = 0;
    MPI_CHECK(MPI_Group_translate_ranks(g_node, 1, &zero, g_comm, &leader));
    MPI_CHECK(MPI_Group_free(&g_node));
    MPI_CHECK(MPI_Group_free(&g_comm));
    MPI_CHECK(MPI_Comm_free(&node));
  }
  std::vector<int> leaders(static_cast<std::size_t>(size));
  MPI_CHECK(MPI_Allgather(&leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, comm));
  std::vector<int> node(leaders.size());
  std::vector<int> seen;  // leaders in order of first appearance
  for (std::size_t r = 0; r < leaders.size(); ++r) {
    auto it = std::find(seen.begin(), seen.end(), leaders[r]);
    if (it == seen.end()) it = seen.insert(seen.end(), leaders[r]);
    node[r] = static_cast<int>(it - seen.begin());
  }
  return node;
}

}  // namespace pdtrain
