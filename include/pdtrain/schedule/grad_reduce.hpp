#pragma once
// Data-parallel gradient reduction in a fixed order. The blocks a replica group shares come in
// groups reduced one at a time (the whole stage at once, or one parameter unit as soon as its
// gradient is final); each group is cut into dp contiguous segments (balanced by size), and
// replica r receives every replica's copy of its segment and adds them in replica order
// 0, 1, ..., dp-1 (the collectives seam, core/collectives.hpp: MpiCollectives over the dp
// communicator, core/fixed_order_reduce). Every element is added in the same order however
// the blocks are grouped, so the result is bitwise the same for any grouping and any message
// timing; replica r then pushes (or, in the replicated baseline, all-gathers) its segment.
//
// Where every compute rank has a GPU of its own (parallel.comm resolved to NCCL), the reducer
// is also given the replicas' NCCL collectives: allreduce_on_device() sums device memory in
// place in the same order (the NCCL collectives' fixed-order kernel), so the gradients never
// cross to the host to be reduced and the bits are those of the host path;
// reduce_scatter_on_device() sums one group's segments the same way and leaves each replica
// its own segment only (PD's streamer: each replica downloads and pushes just that).
#include <mpi.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "pdtrain/core/collectives.hpp"

namespace pdtrain {

class GradReducer {
 public:
  // One group: `blocks` in a fixed order, `numel[i]` the size of blocks[i]. Collective over
  // dp_comm. `on_device`: the same replicas' collectives on device memory (NCCL), or null.
  GradReducer(MPI_Comm dp_comm, std::vector<int> blocks, std::vector<std::int64_t> numel,
              Collectives* on_device = nullptr);
  // Several groups of blocks, each in a fixed order; `numel_by_block[b]` the size of block b.
  GradReducer(MPI_Comm dp_comm, const std::vector<std::vector<int>>& groups,
              const std::vector<std::int64_t>& numel_by_block, Collectives* on_device = nullptr);

  int groups() const { return static_cast<int>(groups_.size()); }
  const std::vector<int>& blocks(int g = 0) const { return groups_[g].blocks; }
  // Blocks of group g whose reduced gradient this replica owns, and their total size.
  const std::vector<int>& my_blocks(int g = 0) const { return groups_[g].mine; }
  std::int64_t my_numel(int g = 0) const { return groups_[g].counts[me_]; }
  std::int64_t total_numel(int g = 0) const { return groups_[g].total; }

  // `packed` holds this replica's gradients of blocks(g) back to back. Returns the sum over
  // replicas of this replica's segment (valid until the next call).
  const float* reduce_scatter(const float* packed, int g = 0) {
    return replicas_->reduce_scatter(packed, groups_[g].counts);
  }
  // Every replica's reduced segment into `packed_out` (all blocks of group g, in order).
  void allgather(const float* my_segment, float* packed_out, int g = 0) {
    replicas_->allgather(my_segment, packed_out, groups_[g].counts);
  }
  // Where this replica's segment of group g starts in the group's packed gradients.
  std::int64_t my_offset(int g = 0) const { return groups_[g].my_offset; }

  // Whether gradients are reduced on the device (NCCL, several replicas).
  bool on_device() const { return device_ != nullptr && dp_ > 1; }
  // The replicas' device collectives (null without NCCL), for another reducer of the rank.
  Collectives* device_collectives() const { return device_; }
  // on_device(): every replica's sum of `data` (n floats of device memory, the same layout on
  // every replica) in place, each element added in replica order: queued on the device, in
  // order with its compute queue. Collective over the replicas.
  void allreduce_on_device(float* data, std::int64_t n);
  // on_device(): `packed` (device memory) holds this replica's gradients of blocks(g) back to
  // back; returns the sum over replicas of this replica's segment (my_numel(g) floats of device
  // memory, each element added in replica order: allreduce_on_device's bits), valid until the
  // collectives' next operation. Queued as allreduce_on_device. Collective over the replicas.
  const float* reduce_scatter_on_device(const float* packed, int g);

  // Sum over replicas of one value per replica, added in replica order.
  double sum(double local);

 private:
  struct Group {
    std::vector<int> blocks, mine;
    std::vector<std::int64_t> counts;  // per replica segment, in floats
    std::int64_t total = 0, my_offset = 0;
  };
  Group make_group(std::vector<int> blocks, const std::vector<std::int64_t>& numel) const;
  void before_device_reduce();  // the checks, and the test hook "dp_reduce"

  MPI_Comm comm_;
  std::unique_ptr<Collectives> replicas_;  // the dp group's collectives (host memory)
  Collectives* device_ = nullptr;          // the dp group's NCCL collectives, or null
  int me_ = 0, dp_ = 1;
  std::vector<Group> groups_;
};

}  // namespace pdtrain
