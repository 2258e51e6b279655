#include "pdtrain/layout/fixed_order_allreduce.hpp"

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"

namespace pdtrain {

FixedOrderAllreduce::FixedOrderAllreduce(MPI_Comm comm) : comm_(comm) {
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

void FixedOrderAllreduce::sum(float* data, std::int64_t n) {
  if (size_ == 1 || n == 0) return;
  std::vector<int> counts(size_), displs(size_);
  for (int r = 0; r < size_; ++r) {
    displs[r] = static_cast<int>(n * r / size_);
    counts[r] = static_cast<int>(n * (r + 1) / size_) - displs[r];
  }
  const int mine = counts[rank_];
  recv_.resize(static_cast<std::size_t>(mine) * size_);
  std::vector<int> rcounts(size_, mine), rdispls(size_);
  for (int r = 0; r < size_; ++r) rdispls[r] = r * mine;
  MPI_Request req;
  MPI_CHECK(MPI_Ialltoallv(data, counts.data(), displs.data(), MPI_FLOAT, recv_.data(),
                           rcounts.data(), rdispls.data(), MPI_FLOAT, comm_, &req));
  wait_quietly(&req);
  float* out = data + displs[rank_];
  for (int i = 0; i < mine; ++i) out[i] = recv_[i];
  for (int r = 1; r < size_; ++r)
    for (int i = 0; i < mine; ++i) out[i] += recv_[static_cast<std::size_t>(r) * mine + i];
  MPI_CHECK(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, data, counts.data(), displs.data(),
                            MPI_FLOAT, comm_, &req));
  wait_quietly(&req);
}

void TensorParallelGroup::allreduce_max(float* data, std::int64_t n) {
  if (size() == 1 || n == 0) return;
  // Max is exact in any order, so MPI's own reduction is deterministic here.
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_MAX, comm_,
                           &req));
  wait_quietly(&req);
}

}  // namespace pdtrain
