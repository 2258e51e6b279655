#pragma once
// All-reduce whose result is the same bits on every rank and every run: the data is cut into one
// segment per rank, rank r adds every rank's copy of segment r in rank order 0..n-1, and the
// sums are all-gathered. (MPI_Allreduce may add in a rank-dependent order for large messages,
// which would let tensor-parallel replicas of the same activation drift apart.)
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "pdtrain/core/collectives.hpp"

namespace pdtrain {

class FixedOrderAllreduce {
 public:
  explicit FixedOrderAllreduce(MPI_Comm comm);
  int rank() const { return rank_; }
  int size() const { return size_; }
  void sum(float* data, std::int64_t n);

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::vector<float> recv_;
};

// The tensor-parallel group of a compute rank, for the model.
class TensorParallelGroup final : public TensorParallelOps {
 public:
  explicit TensorParallelGroup(MPI_Comm tp_comm) : comm_(tp_comm), reduce_(tp_comm) {}
  int rank() const override { return reduce_.rank(); }
  int size() const override { return reduce_.size(); }
  void allreduce_sum(float* data, std::int64_t n) override { reduce_.sum(data, n); }
  void allreduce_max(float* data, std::int64_t n) override;

 private:
  MPI_Comm comm_;
  FixedOrderAllreduce reduce_;
};

}  // namespace pdtrain
