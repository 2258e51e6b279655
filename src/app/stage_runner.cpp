#include "pdtrain/app/stage_runner.hpp"

namespace pdtrain {

void StageRunner::forward(int mb, const float* input) {
  load_tokens(mb);
  stage_.forward(mb % slots_, inputs_.data(), input, targets_.data());
}

void StageRunner::train_layer_major(int n) {
  for (int mb = 0; mb < n; ++mb) {
    load_tokens(mb);
    stage_.load(mb, inputs_.data(), targets_.data());
  }
  stage_.forward_layer_major(n);
  stage_.backward_layer_major(n, dloss_);
}

void StageRunner::load_tokens(int mb) {
  if (val_batches_per_pass_ == 0) {
    source_.train_sequences(step_, first_ + mb * Bm_, Bm_, seq_.data());
  } else {
    const std::int64_t b = mb / val_batches_per_pass_, j = mb % val_batches_per_pass_;
    source_.val_sequences(b, val_batch_size_, first_ + j * Bm_, Bm_, seq_.data());
  }
  data::split_inputs_targets(seq_.data(), Bm_, T_, inputs_.data(), targets_.data());
}

}  // namespace pdtrain
