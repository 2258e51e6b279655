#pragma once
// A PD compute rank's gradients, streamed out during backward. Each parameter unit's gradient
// gets memory when a step first writes it and, as soon as its last write of the step is done
// (its section of the step's last backward), is packed into blocks, reduced over the
// data-parallel replicas and pushed to its holders without waiting, while backward goes on with
// the layers below; its memory goes back to a pool. The step ends by waiting for the pushes
// still on their way.
//
// Memory: a rank holds the gradients of the units between their first and last write (with one
// micro-batch and one stage: the tied embedding from the head's backward to the lookup's, and
// the layer being done; with several micro-batches in the default order, every unit from the
// first backward to the last), plus at most `pd.pushes_in_flight` units on the wire. With one replica
// every unit is pushed from its gradient memory (row-parallel weights' column slabs as strided
// rows); with several, a unit whose blocks are whole rows in storage order (the embeddings, the
// final LayerNorm) is reduced and pushed there too, and a layer is packed into a buffer first
// (the reduction needs its blocks back to back) and its gradient memory reused at once.
// bound_bytes() computes the bound from the backward's order with the same pool arithmetic the
// rank uses, and peak_bytes() is what the rank actually held. (With a lossy or compressing push
// codec the encoded message is held as well, at most as large as the unit.)
//
// With NCCL (every compute rank a GPU of its own, several replicas) a final unit's pushed blocks
// are reduce-scattered over the replicas on the GPUs (GradReducer::reduce_scatter_on_device,
// each element added in the same replica order): a layer's blocks are first gathered on the
// device into a packed buffer in the reducer's order (KernelOps' gather_tiles; its gradient
// memory is free at once), a unit whose blocks are whole rows in storage order is reduced where
// it lies. Only this replica's reduced segment (1/dp of the unit) crosses to the host, into the
// packed buffer's (or the unit's) pinned view, and is pushed from there: no host reduction, and
// each GPU sums just its segment.
//
// On a GPU a final unit's gradient is downloaded to its pinned host view on the copy queue,
// after an event on the compute queue, and packed and pushed only when the next unit is final
// (or the step ends): the host never waits for the backward it has just queued, so the GPU
// keeps computing while the previous unit crosses to the host.
//
// Exact: every element of a gradient is added in the same order as when the whole stage was
// reduced and pushed at once (GradReducer), and holders add contributions per block, so the
// numbers are bitwise those of a whole-stage push.
#include <mpi.h>

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <vector>

#include "pdtrain/core/size_pool.hpp"
#include "pdtrain/core/timer.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"

namespace pdtrain {

class GradStreamer final : public GradUser {
 public:
  // `passes`: backward passes of the stage per step (its micro-batches). `pushes_in_flight`
  // (pd.pushes_in_flight): units on the wire while backward goes on; 1 (the default) lets a
  // unit's push overlap the next unit's backward, a push over shared memory or a network
  // taking far less than a layer's backward, and each more costs a unit of memory; 0 waits for
  // each push before backward goes on (the least memory). Collective over dp_comm.
  // `dp_on_device`: the replicas' NCCL collectives (reduce on the GPU), or null (MPI on the
  // host); `ops`: the device's kernels (the packing gather before a reduce on the GPU).
  // Registers itself as the stage's GradUser.
  GradStreamer(StageParams& params, ParameterService& service, kernels::KernelOps& ops,
               MPI_Comm dp_comm, Collectives* dp_on_device, int passes, int pushes_in_flight,
               TraceRecorder* trace);
  ~GradStreamer() override;
  GradStreamer(const GradStreamer&) = delete;
  GradStreamer& operator=(const GradStreamer&) = delete;

  // The most gradient bytes (unit gradients + packed pushes) a rank with `params` holds in a
  // step of `passes` backward passes, with `replicas` data-parallel replicas and
  // `pushes_in_flight`; `staged`: on a device whose memory is not the host's (a unit waits for
  // its download one release longer); `reduce_on_device`: the replicas reduce on the GPUs
  // (NCCL; with several replicas a packed device buffer is taken when a layer is final).
  static std::int64_t bound_bytes(const StageParams& params, int passes, int replicas,
                                  int pushes_in_flight, bool staged, bool reduce_on_device);
  // The same whichever transport the replicas' reduce resolves to (the plan and the start-up
  // report speak before parallel.comm is resolved): the larger of the two.
  static std::int64_t bound_bytes(const StageParams& params, int passes, int replicas,
                                  int pushes_in_flight, bool staged);

  void begin_step(std::int64_t step);
  void grads_begin(const std::vector<int>& units) override;
  void grads_end(const std::vector<int>& units) override;
  // Every unit's gradient has been pushed; waits for the pushes on their way. Returns the
  // seconds waited.
  double end_step();

  std::int64_t bound() const { return bound_bytes_; }  // bound_bytes() of this rank's step
  std::int64_t peak_bytes() const { return peak_; }
  std::int64_t bytes_held() const { return held_; }
  // Seconds of this rank's time spent packing, reducing and starting pushes (inside backward).
  double stream_seconds() const { return stream_seconds_; }

  // Gradient memory by size, reused across units and steps. The counting is shared by the rank
  // and by bound_bytes(), so the bound is the rank's own arithmetic.
  class PoolCounts {
   public:
    // Floats newly allocated to give out `n` (0 when a free buffer of that size is there).
    std::int64_t take(std::int64_t n);
    void give(std::int64_t n) { ++free_[n]; }

   private:
    std::map<std::int64_t, int> free_;
  };

 private:
  // A push on its way with the memory it is sent from: the unit's gradients (pushed in place),
  // a packed buffer, or (reduced on the device) a packed device buffer's host view.
  struct Push {
    ParameterService::PushTicket ticket = 0;
    Mirrored<float> grads;
    std::vector<float> packed;
    Mirrored<float> device_packed;
  };
  // A final unit on its way to the host view (GPU): its whole gradient, or (reduced on the
  // device) this replica's segment at the front of `grads` or of `device_packed`.
  struct Downloading {
    int unit = -1;
    Mirrored<float> grads;
    Mirrored<float> device_packed;
    bool reduced = false;
    std::unique_ptr<Event> done;
  };
  void bind(int unit);
  void release(int unit);  // the unit's gradient is final
  // GPU: queues the unit's download to its host view: the whole unit, or (NCCL) this replica's
  // reduce-scattered segment.
  void download_unit(int unit, Mirrored<float> grads);
  void download_my_segment(int unit, Mirrored<float> grads);
  const std::vector<kernels::KernelOps::Tile>& device_tiles(int unit, const float* grads);
  void finish_download();  // the unit downloading, if any: wait for it and push it
  // Pushes unit u's gradient from its host view: (pack,) reduce, start the push.
  void push_unit(int unit, Mirrored<float> grads);
  // Pushes this replica's segment, reduced on the device, from the front of the host view of
  // `device_packed` (a layer) or of `grads` (a unit reduced where it lies; the other is empty).
  void push_segment(int unit, Mirrored<float> grads, Mirrored<float> device_packed);
  // Starts `push` of group g from `data` ((pack,) reduce done or not) and keeps it in flight.
  void start(Push push, int group, float* data);
  bool sends_from_tiles(int unit) const;
  // Reduces group g of `data` over the replicas and starts this replica's push of its segment
  // (false when it has none).
  bool reduce_and_start_push(int group, float* data, ParameterService::PushTicket* ticket);
  void retire_pushes(std::size_t keep);
  void recycle(Push& push);
  void give_grads(Mirrored<float> grads);
  std::vector<float> take_packed(std::int64_t n);
  Mirrored<float> take_device_packed(std::int64_t n);
  void count(std::int64_t delta_bytes);

  StageParams& params_;
  ParameterService& service_;
  kernels::KernelOps& ops_;
  Device& device_;
  TraceRecorder* trace_;
  int passes_;
  int pushes_in_flight_;
  int replicas_;  // data-parallel; 1: nothing to reduce, blocks pushed where they lie
  std::int64_t bound_bytes_;
  std::vector<int> writes_per_pass_;  // per unit: grads_end() calls in one backward
  std::vector<int> group_of_unit_;    // the reducer's group of each unit's pushed blocks, or -1
  std::vector<bool> in_place_;        // per unit: pushed from its gradient memory
  // per unit: its pushed blocks' tiles in its gradient memory (gather on the device), once built
  std::vector<std::vector<kernels::KernelOps::Tile>> tiles_;
  GradReducer reducer_;
  std::int64_t step_ = 0;
  std::vector<int> written_;  // per unit: grads_end() calls so far this step
  std::vector<bool> final_;   // per unit: pushed this step
  PoolCounts pool_counts_, packed_counts_;
  SizePool<Mirrored<float>> free_;                               // gradient memory
  std::vector<Mirrored<float>> bound_;                           // per unit, while bound
  Downloading downloading_;                                      // GPU: at most one
  std::deque<Push> pushes_;                                      // oldest first
  SizePool<std::vector<float>> spare_packed_;
  SizePool<Mirrored<float>> spare_device_packed_;  // NCCL: packed buffers on the device
  std::int64_t held_ = 0, peak_ = 0;
  double stream_seconds_ = 0.0;
};

}  // namespace pdtrain
