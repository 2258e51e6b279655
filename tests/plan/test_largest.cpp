// --search --largest on one H200 (machines/h200.toml): with a CPU parameter holder a compute
// rank keeps a bounded parameter cache, its units' gradients and its activations on the GPU, so
// the largest GPT that fits is bounded by the holders' host memory, not by the GPU's, and is
// larger than the replicated baseline's, which keeps parameters, gradients and AdamW state on
// the device.
#include <gtest/gtest.h>

#include "pdtrain/app/report.hpp"
#include "pdtrain/plan/command.hpp"

namespace pdtrain::plan {
namespace {

Machine h200() { return load_machine(PDTRAIN_SOURCE_DIR "/machines/h200.toml"); }

// GPT-2's vocabulary and a 1024-token sequence, 8 sequences a step, bf16, recomputation.
Deck gpt_deck(std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {"model.vocab_size=50257", "model.seq_len=1024", "train.batch_size=8",
                                   "parallel.micro_batches=8", "train.precision=\"bf16\"",
                                   "train.recompute=\"full\"", "pd.cache_mb=1024", "compute.device=\"cuda\""};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return parse_deck("", "t.toml", sets);
}

PlanOptions one_gpu() {
  PlanOptions o;
  connect_plan_to_training(o);
  o.ranks = 2;  // the deck's holder and one compute rank: one H200
  return o;
}

// The same model with one more layer, planned as a run would be.
Prediction with_layers(const LargestAtWidth& w, std::int64_t layers, int holders, const Machine& m) {
  Deck d = gpt_deck({"model.n_layer=" + std::to_string(layers), "model.d_model=" + std::to_string(w.d_model),
                     "model.n_head=" + std::to_string(w.n_head), "parallel.holders=" + std::to_string(holders)});
  d.pd.cache_mb = holders > 0 ? w.cache_mb : d.pd.cache_mb;
  if (holders == 0) d.pd.staleness = 0;
  if (holders > 0) d.parallel.order = StageOrder::layer;  // as the search plans PD
  PlanOptions o = one_gpu();
  o.ranks = holders + 1;
  return predict(checked_input(d, o, m), m);
}

TEST(PlanLargest, HoldersTrainALargerGptOnOneH200ThanTheBaseline) {
  const Machine m = h200();
  const LargestModels r = largest_models(gpt_deck(), one_gpu(), m);
  EXPECT_EQ(r.gpus, 1);
  EXPECT_EQ(r.holders, 1);
  const LargestAtWidth *pd = r.largest(true), *base = r.largest(false);
  ASSERT_NE(pd, nullptr);
  ASSERT_NE(base, nullptr);
  // The baseline needs 24 bytes a parameter on the GPU (fp32 values, gradients, AdamW moments,
  // the stage's resident copy): a few billion on 139 GiB. PD is bounded by the holder's 2 TB
  // of host memory (about 20 bytes a parameter): an order of magnitude more.
  EXPECT_GT(base->params, 2e9);
  EXPECT_LT(base->params, 139.0 * (1 << 30) / 24);
  EXPECT_GT(pd->params, 8 * base->params) << pd->params << " vs " << base->params;
  // PD's GPU does not hold the model: far less than its parameters, gradients and AdamW state.
  double pd_device = 0;
  for (const StagePrediction& s : pd->prediction.stages) pd_device = std::max(pd_device, s.memory.device_total());
  EXPECT_LT(pd_device, m.device.memory_bytes);
  EXPECT_LT(pd_device, 16 * pd->params / 10);
  // "Largest": each width's count fits and one layer more does not.
  for (const LargestAtWidth* w : {pd, base}) {
    const int holders = w == pd ? 1 : 0;
    EXPECT_TRUE(with_layers(*w, w->n_layer, holders, m).fits()) << w->d_model;
    EXPECT_FALSE(with_layers(*w, w->n_layer + 1, holders, m).fits()) << w->d_model;
  }
}

// What makes PD's GPU memory bounded, in the model: the parameters it counts are the cache's,
// the gradients GradStreamer's few units (layer order: one layer's gradients at a time),
// neither growing with the model's depth; the baseline's grow by 26 bytes a parameter (bf16:
// the fp32 values and their bf16 copy, gradients, the replica's values, moments, gradients).
TEST(PlanLargest, PdDeviceParametersAndGradientsDoNotGrowWithDepth) {
  const Machine m = h200();
  auto stage0 = [&](std::int64_t layers, int holders) {
    Deck d = gpt_deck({"model.n_layer=" + std::to_string(layers), "model.d_model=1024", "model.n_head=16",
                       "parallel.holders=" + std::to_string(holders)});
    if (holders == 0) d.pd.staleness = 0;
    if (holders > 0) d.parallel.order = StageOrder::layer;
    PlanOptions o = one_gpu();
    o.ranks = holders + 1;
    return predict(checked_input(d, o, m), m).stages[0].memory;
  };
  const ComputeMemory pd12 = stage0(12, 1), pd48 = stage0(48, 1), base12 = stage0(12, 0), base48 = stage0(48, 0);
  EXPECT_DOUBLE_EQ(pd12.params, pd48.params);
  EXPECT_DOUBLE_EQ(pd12.params, 1024.0 * 1048576);  // pd.cache_mb
  EXPECT_DOUBLE_EQ(pd12.grads, pd48.grads);
  EXPECT_EQ(pd48.optimizer, 0);
  const double layer = 12.0 * 1024 * 1024 + 13 * 1024;
  EXPECT_NEAR(base48.params + base48.grads + base48.optimizer - (base12.params + base12.grads + base12.optimizer),
              26 * 36 * layer, 1e-9 * 26 * 36 * layer);
  EXPECT_EQ(pd48.workspace, 32.0 * 1048576);  // cuBLASLt's, on every GPU rank
}

}  // namespace
}  // namespace pdtrain::plan
