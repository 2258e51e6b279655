#include "pdtrain/schedule/grad_reduce.hpp"

#include <algorithm>

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/layout/layout.hpp"

namespace pdtrain {

GradReducer::GradReducer(MPI_Comm dp_comm, std::vector<int> blocks,
                         std::vector<std::int64_t> numel)
    : comm_(dp_comm), blocks_(std::move(blocks)) {
  MPI_CHECK(MPI_Comm_rank(comm_, &me_));
  MPI_CHECK(MPI_Comm_size(comm_, &dp_));
  const std::vector<int> seg = place_blocks(numel, dp_);  // contiguous, balanced
  counts_.assign(dp_, 0);
  displs_.assign(dp_, 0);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    counts_[seg[i]] += static_cast<int>(numel[i]);
    total_ += numel[i];
    if (seg[i] == me_) my_blocks_.push_back(blocks_[i]);
  }
  for (int r = 1; r < dp_; ++r) displs_[r] = displs_[r - 1] + counts_[r - 1];
  recv_.resize(static_cast<std::size_t>(counts_[me_]) * dp_);
  sum_.resize(static_cast<std::size_t>(counts_[me_]));
}

const float* GradReducer::reduce_scatter(const float* packed) {
  const int mine = counts_[me_];
  if (dp_ == 1) {
    std::copy_n(packed, mine, sum_.begin());
    return sum_.data();
  }
  // Replica r sends segment j to replica j; we receive replica r's copy of our segment at r*mine.
  std::vector<int> rcounts(dp_, mine), rdispls(dp_);
  for (int r = 0; r < dp_; ++r) rdispls[r] = r * mine;
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoallv(packed, counts_.data(), displs_.data(), MPI_FLOAT, recv_.data(),
                           rcounts.data(), rdispls.data(), MPI_FLOAT, comm_, &req));
  wait_quietly(&req);
  std::copy_n(recv_.begin(), mine, sum_.begin());
  for (int r = 1; r < dp_; ++r) {
    const float* src = recv_.data() + static_cast<std::size_t>(r) * mine;
    for (int i = 0; i < mine; ++i) sum_[i] += src[i];
  }
  return sum_.data();
}

void GradReducer::allgather(const float* my_segment, float* packed_out) {
  MPI_Request req;
  MPI_CHECK(MPI_Iallgatherv(my_segment, counts_[me_], MPI_FLOAT, packed_out, counts_.data(),
                            displs_.data(), MPI_FLOAT, comm_, &req));
  wait_quietly(&req);
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
