#pragma once
// The collectives the model needs from its tensor-parallel group, as an interface: the model
// never calls MPI; layout/ provides the MPI implementation and a single rank uses the no-op.
#include <cstdint>

namespace pdtrain {

class TensorParallelOps {
 public:
  virtual ~TensorParallelOps() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Element-wise sum over the group, identical bits on every rank and on every run.
  virtual void allreduce_sum(float* data, std::int64_t n) = 0;
  // Element-wise max over the group.
  virtual void allreduce_max(float* data, std::int64_t n) = 0;
};

class NoTensorParallel final : public TensorParallelOps {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, std::int64_t) override {}
  void allreduce_max(float*, std::int64_t) override {}
};

}  // namespace pdtrain
