#pragma once
// Binds the model stage to the pipeline executor: which tokens a micro-batch holds (training
// step or validation batch), which activation slot it uses, and the loss it adds up. The
// executor moves host memory: a stage on a GPU hands its output and input gradient over
// through pinned host staging.
#include <cstdint>
#include <vector>

#include "pdtrain/data/token_source.hpp"
#include "pdtrain/device/host_staging.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"

namespace pdtrain {

class StageRunner final : public PipelineStageOps {
 public:
  StageRunner(GptStage& stage, const data::TokenSource& source, std::int64_t first_sequence,
              std::int64_t micro_batch, std::int64_t seq_len, int slots, Device& device)
      : stage_(stage), source_(source), first_(first_sequence), Bm_(micro_batch), T_(seq_len),
        slots_(slots), staging_(device), seq_(static_cast<std::size_t>(Bm_ * (T_ + 1))),
        inputs_(static_cast<std::size_t>(Bm_ * T_)), targets_(inputs_.size()) {}

  // Micro-batch mb of training step `step`, d(loss)/d(token loss) = dloss.
  void train(std::int64_t step, float dloss) {
    step_ = step, val_batches_per_pass_ = 0, dloss_ = dloss;
  }
  // Micro-batch q = b * micro_batches + j of validation batch b.
  void eval(int micro_batches, std::int64_t batch_size) {
    val_batches_per_pass_ = micro_batches, val_batch_size_ = batch_size;
  }
  // The step's micro-batches 0..n-1 in layer-major order (StageOrder::layer, one stage).
  void train_layer_major(int n);
  // The pass's summed token losses (0 off the last stage): once per pass, after it.
  double loss_sum() { return stage_.take_loss_sum(); }

  void forward(int mb, const float* input) override;
  const float* output(int mb) override {
    return staging_.download(stage_.output(mb % slots_), stage_.activation_numel());
  }
  void backward(int mb, const float* doutput) override {
    stage_.backward(mb % slots_, dloss_, doutput);
  }
  const float* dinput() override {
    return staging_.download(stage_.dinput(), stage_.activation_numel());
  }

 private:
  void load_tokens(int mb);

  GptStage& stage_;
  const data::TokenSource& source_;
  std::int64_t first_, Bm_, T_;
  int slots_;
  HostStaging staging_;
  std::vector<std::int32_t> seq_, inputs_, targets_;
  std::int64_t step_ = 0, val_batch_size_ = 0;
  int val_batches_per_pass_ = 0;
  float dloss_ = 0.0f;
};

}  // namespace pdtrain
