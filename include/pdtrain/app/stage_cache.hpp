#pragma once
// A compute rank's stage parameters streamed through the PD parameter cache: the model's
// need() calls become cache uses, fetched blocks are unpacked into the stage's units, and the
// use plans come from the pipeline schedule and the model's layer order.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/pd/param_cache.hpp"
#include "pdtrain/schedule/pipeline_schedule.hpp"

namespace pdtrain {

class StageCache final : public UnitStore, public UnitUser {
 public:
  StageCache(StageParams& params, ParameterService& service, std::int64_t capacity_bytes,
             int prefetch_depth, TraceRecorder* trace);
  ~StageCache() override;

  static std::vector<CacheUnit> units_of(const StageParams& params);
  // One optimizer step of `micro_batches` on this stage under `kind`: every forward's uses and
  // every backward's, in the order the schedule runs them.
  static std::vector<std::vector<int>> step_plan(const StageParams& params, PipelineKind kind,
                                                 int stages, int stage, int micro_batches);
  // One optimizer step in layer-major order (StageOrder::layer): one forward's uses, then one
  // backward's, whatever the micro-batch count.
  static std::vector<std::vector<int>> layer_major_plan(const StageParams& params);
  // `forwards` forward passes (evaluation).
  static std::vector<std::vector<int>> eval_plan(const StageParams& params, int forwards);

  void begin(std::int64_t version, std::vector<std::vector<int>> plan) {
    cache_.begin(version, std::move(plan));
  }
  void end() { cache_.end(); }
  const CacheStats& stats() const { return cache_.stats(); }

  // The hotness table: one row per block with its unit's uses and fetches.
  void write_heat_map(const std::string& path) const;
  // "cache: ..." for the run's summary.
  std::string summary(double step_seconds) const;

  void need(const std::vector<int>& units) override { cache_.acquire(units); }
  void bind(int unit, float* storage, float* staging) override {
    params_.bind_unit(unit, storage, staging);
  }
  void unpack(int block, const float* data) override;

 private:
  StageParams& params_;
  ParamCache cache_;
};

}  // namespace pdtrain
