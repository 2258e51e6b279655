#pragma once
// The MPI implementation of the collectives seam (core/collectives.hpp) over host memory: sums
// are core's fixed-order reduce-scatter/all-gather (rank r adds every rank's copy of its segment
// in rank order 0..n-1), so every rank gets the same bits on every run whatever the timing;
// max is MPI's own (exact in any order); messages are MPI_Isend/MPI_Irecv waited on quietly.
// Used for the tensor-parallel group, the data-parallel gradient reduce and the pipeline.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "pdtrain/core/collectives.hpp"
#include "pdtrain/core/fixed_order_reduce.hpp"

namespace pdtrain {

class MpiCollectives final : public Collectives {
 public:
  // Collective over `comm`, which it duplicates, so its messages never match anyone else's.
  explicit MpiCollectives(MPI_Comm comm,
                          std::int64_t max_message = FixedOrderReducer::kMaxMessageFloats);
  ~MpiCollectives() override;
  MpiCollectives(const MpiCollectives&) = delete;
  MpiCollectives& operator=(const MpiCollectives&) = delete;

  const char* transport() const override { return "mpi"; }
  int rank() const override { return reduce_.rank(); }
  int size() const override { return reduce_.size(); }
  void allreduce_sum(float* data, std::int64_t n) override { reduce_.allreduce(data, n); }
  void allreduce_max(float* data, std::int64_t n) override;
  const float* reduce_scatter(const float* data,
                              const std::vector<std::int64_t>& counts) override {
    return reduce_.reduce_scatter(data, counts);
  }
  void allgather(const float* segment, float* out,
                 const std::vector<std::int64_t>& counts) override {
    reduce_.allgather(segment, out, counts);
  }
  void send(const float* data, std::int64_t n, int peer, int tag) override;
  void recv(float* data, std::int64_t n, int peer, int tag) override;
  void end_group() override;  // waits (quietly) for the group's receives
  void finish_sends() override;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;  // for max and messages
  FixedOrderReducer reduce_;       // on its own duplicate
  std::vector<MPI_Request> receives_, sends_;
};

}  // namespace pdtrain
