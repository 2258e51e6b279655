#pragma once
// Data-parallel gradient reduction in a fixed order. The blocks a replica group shares are cut
// into dp contiguous segments (balanced by size); replica r receives every replica's copy of
// segment r and adds them in replica order 0, 1, ..., dp-1 (core/fixed_order_reduce). The
// result is bitwise the same on every run whatever the message timing, and replica r then
// pushes (or, in the replicated baseline, all-gathers) its segment.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "pdtrain/core/fixed_order_reduce.hpp"

namespace pdtrain {

class GradReducer {
 public:
  // `blocks` in a fixed order, `numel[i]` the size of blocks[i]. Collective over dp_comm.
  GradReducer(MPI_Comm dp_comm, std::vector<int> blocks, std::vector<std::int64_t> numel);

  const std::vector<int>& blocks() const { return blocks_; }
  // Blocks whose reduced gradient this replica owns, and their total size.
  const std::vector<int>& my_blocks() const { return my_blocks_; }
  std::int64_t my_numel() const { return counts_[me_]; }
  std::int64_t total_numel() const { return total_; }

  // `packed` holds this replica's gradients of blocks() back to back. Returns the sum over
  // replicas of this replica's segment (valid until the next call).
  const float* reduce_scatter(const float* packed) { return reduce_.reduce_scatter(packed, counts_); }
  // Every replica's reduced segment into `packed_out` (all blocks, blocks() order).
  void allgather(const float* my_segment, float* packed_out) {
    reduce_.allgather(my_segment, packed_out, counts_);
  }
  // Sum over replicas of one value per replica, added in replica order.
  double sum(double local);

 private:
  MPI_Comm comm_;
  int me_ = 0, dp_ = 1;
  std::vector<int> blocks_, my_blocks_;
  std::vector<std::int64_t> counts_;  // per replica segment, in floats
  std::int64_t total_ = 0;
  FixedOrderReducer reduce_;
};

}  // namespace pdtrain
