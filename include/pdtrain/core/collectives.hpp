#pragma once
// The seam of compute-to-compute traffic. Everything compute ranks exchange among themselves
// goes through one interface with two implementations:
//
//  - MPI over host memory (core/mpi_collectives.hpp, MpiCollectives): the fixed-order sums of
//    core/fixed_order_reduce and MPI point-to-point; on a GPU rank the callers stage device
//    memory through pinned host memory (device/host_staging). Also the fallback when ranks share
//    a GPU or the binary has no NCCL.
//  - NCCL on device memory (device/nccl_collectives.hpp, CUDA builds with NCCL): its own stream,
//    gated by events on the compute queue, so nothing waits on the host; its sums are the same
//    fixed-order sums (a kernel adds the gathered copies in rank order), the MPI path's bits.
//    It serves every group (tp, dp, pp) when every compute rank has a GPU of its own
//    (app/compute_comms).
//
// TensorParallelOps is the part the model sees (its tp all-reduces, so model/ never calls MPI);
// Collectives adds what the data-parallel gradient reduce and the pipeline need. Holders never
// take part: every group is a group of compute ranks.
#include <cstdint>
#include <vector>

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

class Collectives : public TensorParallelOps {
 public:
  virtual const char* transport() const = 0;  // "mpi" | "nccl"
  // Whether the buffers passed in are device memory (NCCL) rather than host memory (MPI). Then
  // every operation is ordered with the device's compute queue: it reads its inputs after the
  // compute queued before it, and compute queued after it (end_group() for messages) runs after
  // it has read and written its buffers, so that compute may reuse them at once.
  virtual bool device_memory() const { return false; }

  // `data` holds this rank's copy of every segment, back to back in rank order (counts[r]
  // floats for rank r, the same counts on every rank). Returns the sum over the group of this
  // rank's segment, identical on every run; valid until the next call (with one rank: `data`).
  virtual const float* reduce_scatter(const float* data,
                                      const std::vector<std::int64_t>& counts) = 0;
  // Puts every rank's `segment` (counts[rank] floats) at its place in `out`. `segment` may be
  // this rank's place in `out`, but no other rank's.
  virtual void allgather(const float* segment, float* out,
                         const std::vector<std::int64_t>& counts) = 0;

  // Point-to-point messages in groups: send() and recv() post a message (matched by peer and
  // tag on MPI, by peer and posting order on NCCL), and end_group() ends the group of those
  // posted since the last one: from then on the group's receives may be read (on the host for
  // MPI; in queue order on the device for NCCL). A group's messages start together, so a group
  // that holds a send and a receive cannot deadlock with its partner's mirror group even when
  // sends block until matched (see pair_messages in schedule/pipeline_schedule.hpp).
  virtual void send(const float* data, std::int64_t n, int peer, int tag) = 0;
  virtual void recv(float* data, std::int64_t n, int peer, int tag) = 0;
  virtual void end_group() = 0;
  // Every send posted so far has left its buffer: the buffers may be reused.
  virtual void finish_sends() = 0;
};

}  // namespace pdtrain
