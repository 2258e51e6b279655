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
// first backward to the last), plus at most kPushesInFlight units on the wire. A unit whose
// blocks are whole rows in storage order (the embeddings, the final LayerNorm) is pushed from
// its gradient memory; a layer (whose row-parallel weights are column slabs) is packed into a
// buffer first and its gradient memory reused at once. bound_bytes() computes the bound from
// the backward's order with the same pool arithmetic the rank uses, and peak_bytes() is what
// the rank actually held.
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

#include "pdtrain/core/timer.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/io/trace.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"

namespace pdtrain {

class GradStreamer final : public GradUser {
 public:
  // One unit on the wire while the next one's backward runs: a push over shared memory or a
  // network takes far less than a layer's backward, and each more in flight costs a unit.
  static constexpr int kPushesInFlight = 1;

  // `passes`: backward passes of the stage per step (its micro-batches). Collective over
  // dp_comm. Registers itself as the stage's GradUser.
  GradStreamer(StageParams& params, ParameterService& service, MPI_Comm dp_comm, int passes,
               TraceRecorder* trace);
  ~GradStreamer() override;
  GradStreamer(const GradStreamer&) = delete;
  GradStreamer& operator=(const GradStreamer&) = delete;

  // The most gradient bytes (unit gradients + packed pushes) a rank with `params` holds in a
  // step of `passes` backward passes.
  static std::int64_t bound_bytes(const StageParams& params, int passes);

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
  // A push on its way with the memory it is sent from: the unit's gradients (pushed in place)
  // or a packed buffer.
  struct Push {
    ParameterService::PushTicket ticket = 0;
    Mirrored<float> grads;
    std::vector<float> packed;
  };
  void bind(int unit);
  void release(int unit);  // the unit's gradient is final: (pack,) reduce, push
  // Reduces group g of `data` over the replicas and starts this replica's push of its segment
  // (false when it has none).
  bool reduce_and_start_push(int group, float* data, ParameterService::PushTicket* ticket);
  void retire_pushes(std::size_t keep);
  void recycle(Push& push);
  void give_grads(Mirrored<float> grads);
  std::vector<float> take_packed(std::int64_t n);
  void count(std::int64_t delta_bytes);

  StageParams& params_;
  ParameterService& service_;
  Device& device_;
  TraceRecorder* trace_;
  int passes_;
  std::int64_t bound_bytes_;
  std::vector<int> writes_per_pass_;  // per unit: grads_end() calls in one backward
  std::vector<int> group_of_unit_;    // the reducer's group of each unit's pushed blocks, or -1
  std::vector<bool> in_place_;        // per unit: pushed from its gradient memory
  GradReducer reducer_;
  std::int64_t step_ = 0;
  std::vector<int> written_;  // per unit: grads_end() calls so far this step
  std::vector<bool> final_;   // per unit: pushed this step
  PoolCounts pool_counts_, packed_counts_;
  std::map<std::int64_t, std::vector<Mirrored<float>>> free_;  // by size
  std::vector<Mirrored<float>> bound_;                           // per unit, while bound
  std::deque<Push> pushes_;                                      // oldest first
  std::vector<std::vector<float>> spare_packed_;
  std::int64_t held_ = 0, peak_ = 0;
  double stream_seconds_ = 0.0;
};

}  // namespace pdtrain
