// The replicated baseline's step: the rank's own DeviceReplica scatters each version into the
// stage on the device; the stage's gradients are reduced over the replicas (with one replica
// they never leave the device) and the replica applies AdamW there.
#include <memory>
#include <vector>

#include "pdtrain/app/parameter_step.hpp"
#include "pdtrain/core/error.hpp"

namespace pdtrain {

namespace {

class ReplicaStep final : public ParameterStep {
 public:
  ReplicaStep(std::unique_ptr<DeviceReplica> replica, StepParts parts);

  ParameterService& owner() override { return *replica_; }
  double use_version(std::int64_t version) override;
  PassTimes train_pass(std::int64_t, const std::function<void()>& pass) override {
    pass();  // the whole stage is resident
    return {};
  }
  double eval_pass(int, const std::function<void()>& pass) override {
    pass();
    return 0.0;
  }
  void gradients_out(std::int64_t step, StepRecord& rec) override;
  // The replica knows each update's figures as it applies it.
  void learn_update_figures(std::int64_t) override {}
  std::string after_loss_divergence(std::int64_t step) const override {
    return "; its update was not applied, and no checkpoint was written after step " +
           std::to_string(step - 1);
  }
  std::string norm_divergence(const UpdateInfo&) const override {
    return replica_->divergence();
  }
  ParameterFigures figures() const override { return {*replica_}; }
  void write_fetch_figures(const std::string&, int) const override {}  // nothing is fetched

 private:
  void update_on_device(std::int64_t step, StepRecord& rec);
  void reduce_and_push(std::int64_t step, StepRecord& rec);

  std::unique_ptr<DeviceReplica> replica_;
  StageParams& stage_;
  GradReducer& reducer_;
  kernels::KernelOps& ops_;
  StepPhases& phases_;
  bool one_replica_;
  std::vector<kernels::KernelOps::Tile> tiles_;  // every block in the stage's buffers
  std::vector<float> packed_;                    // dp > 1: the stage's gradients, packed
  std::int64_t have_version_ = -1;               // the version scattered into the stage
};

ReplicaStep::ReplicaStep(std::unique_ptr<DeviceReplica> replica, StepParts parts)
    : replica_(std::move(replica)), stage_(parts.stage), reducer_(parts.reducer),
      ops_(parts.ops), phases_(parts.phases), one_replica_(parts.layout.shape().dp == 1) {
  // The baseline's stage is the whole model (dp only): its blocks are every block, in order,
  // as the replica packs them.
  PDT_CHECK(stage_.needed_blocks().size() == stage_.catalog().blocks().size(),
            "the replicated baseline's stage must hold every block");
  tiles_ = stage_.tiles(stage_.needed_blocks());
  if (!one_replica_ && !reducer_.on_device())
    packed_.resize(static_cast<std::size_t>(reducer_.total_numel()));
}

// The replica's parameters of `version` into the stage, on the device (in bf16 precision
// rounded, with their bf16 copies, as unpack_param does).
double ReplicaStep::use_version(std::int64_t version) {
  if (version == have_version_) return 0.0;
  ScopedPhase t(phases_.timers(), "fetch");
  const double t0 = now_seconds();
  PDT_CHECK(version == replica_->version(),
            "replica at version " + std::to_string(replica_->version()) + ", asked for " +
                std::to_string(version));
  ops_.scatter_tiles(stage_.params_device(), stage_.params_bf16_device(), replica_->params(),
                     tiles_);
  have_version_ = version;
  return now_seconds() - t0;
}

void ReplicaStep::gradients_out(std::int64_t step, StepRecord& rec) {
  if (one_replica_)
    update_on_device(step, rec);
  else
    reduce_and_push(step, rec);
}

// One replica: nothing to reduce; the stage's gradients are packed on the device and the
// replica's optimizer step runs there.
void ReplicaStep::update_on_device(std::int64_t step, StepRecord& rec) {
  const double t0 = now_seconds();
  ops_.gather_tiles(replica_->grads(), stage_.grads_device(), tiles_);
  const double t1 = now_seconds();
  phases_.record(rec.reduce_ms, "reduce", t0, t1, nullptr, nullptr);
  replica_->update(step, replica_->grads());
  phases_.record(rec.push_ms, "push", t1, now_seconds(), "update", "pd");
}

// Several replicas: the gradients packed on the host, reduce-scattered and all-gathered in a
// fixed order, then every replica applies the same update. With NCCL the same sums are made
// on the GPUs (GradReducer::allreduce_on_device) and never leave them.
void ReplicaStep::reduce_and_push(std::int64_t step, StepRecord& rec) {
  const double t0 = now_seconds();
  if (reducer_.on_device()) {  // NCCL: packed and summed on the GPUs, in the same order
    ops_.gather_tiles(replica_->grads(), stage_.grads_device(), tiles_);
    reducer_.allreduce_on_device(replica_->grads(), reducer_.total_numel());
    const double t1 = now_seconds();
    phases_.record(rec.reduce_ms, "reduce", t0, t1, "reduce", "dp");
    replica_->update(step, replica_->grads());
    phases_.record(rec.push_ms, "push", t1, now_seconds(), "update", "pd");
    return;
  }
  const ParamCatalog& cat = stage_.catalog();
  stage_.download_grads();
  float* p = packed_.data();
  for (int b : reducer_.blocks()) {
    stage_.pack_grad(cat.block(b), p);
    p += cat.block(b).numel();
  }
  reducer_.allgather(reducer_.reduce_scatter(packed_.data()), packed_.data());
  const double t1 = now_seconds();
  phases_.record(rec.reduce_ms, "reduce", t0, t1, "reduce", "dp");
  replica_->push(step, reducer_.blocks(), packed_.data());
  phases_.record(rec.push_ms, "push", t1, now_seconds(), "push", "pd");
}

}  // namespace

std::unique_ptr<ParameterStep> make_parameter_step(std::unique_ptr<DeviceReplica> replica,
                                                   StepParts parts) {
  return std::make_unique<ReplicaStep>(std::move(replica), parts);
}

}  // namespace pdtrain
