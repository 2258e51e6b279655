#pragma once
// Deck settings with a fixed set of values that several parts read: parsed once, by deck/, into
// these enums (the schema names their values), so no part compares their text.

namespace pdtrain {

// fp32: parameters as the holders keep them. bf16 (mixed precision): compute ranks see every
// parameter rounded to bf16 (the copies holders serve) and keep a bf16 copy beside the fp32
// values for the matmuls; gradients stay fp32.
enum class Precision { fp32, bf16 };

// The order a step runs its micro-batches in. `micro_batch`: each micro-batch's forward and
// backward through the whole stage in turn (what the pipeline schedules interleave). `layer`
// (one stage only, as L2L does): every micro-batch through a unit before the next unit, forward
// then backward, so a step uses each parameter unit once per direction (a bounded PD cache
// fetches the stage twice per step, whatever the micro-batch count) and writes each unit's
// gradient in one section (GradStreamer frees it before the next), for all micro-batches'
// activations and residual gradients kept at once.
enum class StageOrder { micro_batch, layer };

}  // namespace pdtrain
