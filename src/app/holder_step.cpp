// PD's step: parameters fetched from the holders by the stage cache during each pass,
// gradients reduced over the replicas and pushed by the streamer during backward.
#include <memory>

#include "pdtrain/app/parameter_step.hpp"
#include "pdtrain/io/output_file.hpp"
#include "pdtrain/optim/divergence.hpp"

namespace pdtrain {

namespace {

class HolderStep final : public ParameterStep {
 public:
  HolderStep(std::unique_ptr<FetchClient> client, StepParts parts);

  ParameterService& owner() override { return *client_; }
  double use_version(std::int64_t version) override {
    version_ = version;  // fetched during the passes
    return 0.0;
  }
  PassTimes train_pass(std::int64_t step, const std::function<void()>& pass) override;
  double eval_pass(int forwards, const std::function<void()>& pass) override {
    return cache_pass(StageCache::eval_plan(stage_, forwards), pass);
  }
  void gradients_out(std::int64_t step, StepRecord& rec) override;
  void learn_update_figures(std::int64_t version) override;
  std::string after_loss_divergence(std::int64_t) const override {
    return "; the holders may have applied its update (they do before its loss is known, when "
           "its gradient norm is finite), and no final checkpoint was written";
  }
  std::string norm_divergence(const UpdateInfo& info) const override {
    return divergence_message(info.version, "the gradient norm", info.grad_norm,
                              "agreed by the holders") +
           "; the holders applied no update from this step on";
  }
  ParameterFigures figures() const override {
    return {*client_, &cache_, train_fetched_bytes_, &grads_};
  }
  void write_fetch_figures(const std::string& out_dir, int world_rank) const override {
    const std::string dir = out_dir + "/pd_heat";
    create_output_directory(dir);
    cache_.write_heat_map(dir + "/rank-" + std::to_string(world_rank) + ".csv");
  }

 private:
  double cache_pass(std::vector<std::vector<int>> plan, const std::function<void()>& pass);

  std::unique_ptr<FetchClient> client_;
  StageParams& stage_;
  StepPhases& phases_;
  StageCache cache_;
  GradStreamer grads_;
  std::vector<std::vector<int>> step_plan_;  // the cache's uses in one step
  std::int64_t version_ = 0;                 // the version the next pass computes on
  double streamed_before_ = 0.0;             // grads_.stream_seconds() at the step's start
  std::int64_t train_fetched_bytes_ = 0;     // fetched by training passes (not evaluation)
};

std::vector<std::vector<int>> step_plan_of(const StepParts& p) {
  return p.deck.parallel.order == StageOrder::layer
             ? StageCache::layer_major_plan(p.stage)
             : StageCache::step_plan(p.stage, p.kind, p.layout.shape().pp, p.layout.pp_rank(),
                                     p.micro_batches);
}

HolderStep::HolderStep(std::unique_ptr<FetchClient> client, StepParts parts)
    : client_(std::move(client)), stage_(parts.stage), phases_(parts.phases),
      cache_(parts.stage, *client_, static_cast<std::int64_t>(parts.deck.pd.cache_mb * 1048576.0),
             static_cast<int>(parts.deck.pd.prefetch_depth), parts.phases.trace(),
             parts.deck.pd.cache_warm_steps),
      grads_(parts.stage, *client_, parts.ops, parts.layout.dp_comm(),
             parts.reducer.device_collectives(), backward_passes(parts.deck),
             static_cast<int>(parts.deck.pd.pushes_in_flight), parts.phases.trace()),
      step_plan_(step_plan_of(parts)) {}

PassTimes HolderStep::train_pass(std::int64_t step, const std::function<void()>& pass) {
  grads_.begin_step(step);
  streamed_before_ = grads_.stream_seconds();
  const std::int64_t fetched0 = cache_.stats().bytes_fetched;
  PassTimes t;
  t.fetch_wait = cache_pass(step_plan_, pass);
  train_fetched_bytes_ += cache_.stats().bytes_fetched - fetched0;
  t.streamed = grads_.stream_seconds() - streamed_before_;
  return t;
}

// Units were reduced and pushed during backward; the step's last pushes drain here.
void HolderStep::gradients_out(std::int64_t, StepRecord& rec) {
  rec.reduce_ms = 1e3 * (grads_.stream_seconds() - streamed_before_);
  phases_.timers().add("reduce", rec.reduce_ms / 1e3);
  const double t0 = now_seconds();
  const double waited = grads_.end_step();
  phases_.record(rec.push_ms, "push", t0, t0 + waited, "push", "pd");
}

// The holders' figures of every update up to `version` arrive with any fetch of it: one small
// block.
void HolderStep::learn_update_figures(std::int64_t version) {
  const std::vector<int>& blocks = stage_.needed_blocks();
  const ParamCatalog& cat = stage_.catalog();
  int smallest = blocks.front();
  for (int b : blocks)
    if (cat.block(b).numel() < cat.block(smallest).numel()) smallest = b;
  client_->fetch(version, {smallest}, [](int, const float*) {});
}

// One pass of the cache over `plan` on the selected version; returns the seconds it waited.
double HolderStep::cache_pass(std::vector<std::vector<int>> plan,
                              const std::function<void()>& pass) {
  const double wait0 = cache_.stats().wait_seconds;
  cache_.begin(version_, std::move(plan));
  pass();
  cache_.end();
  const double waited = cache_.stats().wait_seconds - wait0;
  phases_.timers().add("fetch", waited);
  return waited;
}

}  // namespace

std::unique_ptr<ParameterStep> make_parameter_step(std::unique_ptr<FetchClient> client,
                                                   StepParts parts) {
  return std::make_unique<HolderStep>(std::move(client), parts);
}

}  // namespace pdtrain
