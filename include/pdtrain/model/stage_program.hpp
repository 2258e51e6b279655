#pragma once
// A stage's traversal written once: the list of its steps (the embedding, each layer, the head),
// each with the parameter units it reads and writes gradients into. Forward runs the steps in
// order, backward in reverse; GptStage's traversals loop over this list, and the use lists a
// parameter cache plans from (forward_uses, backward_uses) and the gradient sections a streamer
// counts (backward_grad_uses) are derived from the same list, so they cannot disagree with the
// order the model announces its uses in.
#include <cstdint>
#include <vector>

#include "pdtrain/model/stage_params.hpp"

namespace pdtrain {

struct StageStep {
  enum class Kind { embedding, layer, head };
  Kind kind = Kind::layer;
  std::int64_t layer = 0;  // Kind::layer: the stage's layer index (unit `layer`)
  std::vector<int> units;  // what its forward reads and its backward adds gradients into
  // The embedding's backward scatters into its gradients without reading a parameter.
  bool backward_reads_params() const { return kind != Kind::embedding; }
};

class StageProgram {
 public:
  // The steps of the stage `p` holds: the embedding on the first stage ({wte, wpe}), each of
  // its layers, the head on the last ({lnf, wte}: the tied LM head).
  explicit StageProgram(const StageParams& p);
  const std::vector<StageStep>& steps() const { return steps_; }

  // The units one forward / backward announces through StageParams::need(), in order.
  std::vector<std::vector<int>> forward_uses() const;
  std::vector<std::vector<int>> backward_uses() const;
  // The units each section of one backward adds gradients into, in the order it announces them
  // through StageParams::grads_begin()/grads_end().
  std::vector<std::vector<int>> backward_grad_uses() const;

 private:
  std::vector<StageStep> steps_;
};

}  // namespace pdtrain
