#include "pdtrain/schedule/grad_reduce.hpp"

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/layout/placement.hpp"

namespace pdtrain {

GradReducer::GradReducer(MPI_Comm dp_comm, std::vector<int> blocks,
                         std::vector<std::int64_t> numel)
    : comm_(dp_comm), blocks_(std::move(blocks)), reduce_(dp_comm) {
  me_ = reduce_.rank();
  dp_ = reduce_.size();
  const std::vector<int> seg = place_blocks(numel, dp_);  // contiguous, balanced
  counts_.assign(dp_, 0);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    counts_[seg[i]] += numel[i];
    total_ += numel[i];
    if (seg[i] == me_) my_blocks_.push_back(blocks_[i]);
  }
}

double GradReducer::sum(double local) {
  std::vector<double> all(static_cast<std::size_t>(dp_));
  MPI_Request req;
  MPI_CHECK(MPI_Iallgather(&local, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_, &req));
  wait_quietly(&req);
  double s = 0.0;
  for (double v : all) s += v;
  return s;
}

}  // namespace pdtrain
