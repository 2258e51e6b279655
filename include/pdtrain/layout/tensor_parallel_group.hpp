#pragma once
// The tensor-parallel group of a compute rank, as the model sees it (TensorParallelOps): sums
// are fixed-order all-reduces (core/fixed_order_reduce), so every tp rank gets the same bits
// and tensor-parallel replicas of an activation never drift apart.
#include <mpi.h>

#include <cstdint>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/fixed_order_reduce.hpp"

namespace pdtrain {

class TensorParallelGroup final : public TensorParallelOps {
 public:
  explicit TensorParallelGroup(MPI_Comm tp_comm) : comm_(tp_comm), reduce_(tp_comm) {}
  int rank() const override { return reduce_.rank(); }
  int size() const override { return reduce_.size(); }
  void allreduce_sum(float* data, std::int64_t n) override { reduce_.allreduce(data, n); }
  void allreduce_max(float* data, std::int64_t n) override;

 private:
  MPI_Comm comm_;
  FixedOrderReducer reduce_;
};

}  // namespace pdtrain
