#pragma once
// Binds the model stage to the pipeline executor: which tokens a micro-batch holds (training
// step or validation batch), which activation slot it uses, and the loss it adds up. Where the
// pp group moves host memory (MPI), a stage on a GPU hands its output and input gradient over
// through pinned host staging; where it moves device memory (NCCL), the stage's device
// pointers go to the executor as they are and the runner is the executor's MessageMemory
// (its device receive buffer).
#include <cstdint>
#include <deque>
#include <vector>

#include "pdtrain/data/token_source.hpp"
#include "pdtrain/device/host_staging.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/schedule/pipeline_executor.hpp"

namespace pdtrain {

class StageRunner final : public PipelineStageOps, public MessageMemory {
 public:
  // `device_messages`: the pp group moves device memory (Collectives::device_memory()).
  StageRunner(GptStage& stage, const data::TokenSource& source, std::int64_t first_sequence,
              std::int64_t micro_batch, std::int64_t seq_len, int slots, Device& device,
              bool device_messages = false)
      : stage_(stage), source_(source), first_(first_sequence), Bm_(micro_batch), T_(seq_len),
        slots_(slots), device_(device), device_messages_(device_messages), staging_(device),
        seq_(static_cast<std::size_t>(Bm_ * (T_ + 1))),
        inputs_(static_cast<std::size_t>(Bm_ * T_)), targets_(inputs_.size()) {}

  // The executor's message memory: this runner where messages are device memory, else null.
  MessageMemory* message_memory() { return device_messages_ ? this : nullptr; }

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
  const float* output(int mb) override { return message(stage_.output(mb % slots_)); }
  void backward(int mb, const float* doutput) override {
    stage_.backward(mb % slots_, dloss_, doutput);
  }
  const float* dinput() override { return message(stage_.dinput()); }

  float* allocate(std::int64_t n) override {
    return messages_.emplace_back(device_, n, MemoryKind::device).data();
  }

 private:
  void load_tokens(int mb);
  // A stage's device activation as the executor takes it: itself, or its host copy.
  const float* message(const float* activation) {
    if (device_messages_) return activation;
    return staging_.download(activation, stage_.activation_numel());
  }

  GptStage& stage_;
  const data::TokenSource& source_;
  std::int64_t first_, Bm_, T_;
  int slots_;
  Device& device_;
  bool device_messages_;
  HostStaging staging_;
  std::deque<Buffer<float>> messages_;  // device_messages_: the executor's receive buffer
  std::vector<std::int32_t> seq_, inputs_, targets_;
  std::int64_t step_ = 0, val_batch_size_ = 0;
  int val_batches_per_pass_ = 0;
  float dloss_ = 0.0f;
};

}  // namespace pdtrain
