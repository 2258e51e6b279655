// --search: every layout it lists is one training accepts for the rank count, ranked as it says
// (those that fit first, then by predicted tokens/s), and each prediction is the model's for
// that layout.
#include <gtest/gtest.h>

#include "pdtrain/app/report.hpp"
#include "pdtrain/plan/command.hpp"

namespace pdtrain::plan {
namespace {

Machine machine(const char* file) { return load_machine(std::string(PDTRAIN_SOURCE_DIR "/machines/") + file); }

void expect_ranked(const std::vector<RankedLayout>& found) {
  ASSERT_FALSE(found.empty());
  for (std::size_t i = 1; i < found.size(); ++i) {
    const Prediction &a = found[i - 1].prediction, &b = found[i].prediction;
    EXPECT_TRUE(a.fits() >= b.fits()) << i;
    if (a.fits() == b.fits()) EXPECT_GE(a.tokens_per_s, b.tokens_per_s) << i;
  }
}

TEST(PlanSearch, ListsEveryAcceptedLayoutOfTheRanksRanked) {
  const Deck deck = parse_deck("", "t.toml", {"model.n_layer=4", "model.d_model=64", "train.batch_size=16"});
  PlanOptions o;
  connect_plan_to_training(o);
  o.ranks = 6;
  const Machine cpu = machine("cpu-local.toml");
  const std::vector<RankedLayout> found = search_layouts(deck, o, cpu);
  expect_ranked(found);
  bool has_deck_layout = false;
  for (const RankedLayout& r : found) {
    const LayoutShape& L = r.input.layout;
    EXPECT_EQ(L.world(), 6);
    EXPECT_EQ(deck.train.batch_size % (L.dp * r.input.micro_batches), 0);
    // Each prediction is the model's for its layout.
    EXPECT_DOUBLE_EQ(r.prediction.step.total, predict(r.input, cpu).step.total);
    has_deck_layout = has_deck_layout || (L.holders == 1 && L.dp == 5 && L.tp == 1 && L.pp == 1);
  }
  EXPECT_FALSE(has_deck_layout);  // batch 16 does not split over 5 replicas
  EXPECT_GT(found.size(), 20u);
}

// The baseline runs at any layout, so the search weighs it at tensor and pipeline layouts too.
TEST(PlanSearch, WeighsTheBaselineAtTensorAndPipelineLayouts) {
  const Deck deck = parse_deck("", "t.toml", {"model.n_layer=4", "model.d_model=64", "train.batch_size=16"});
  PlanOptions o;
  connect_plan_to_training(o);
  o.ranks = 4;
  bool tp2pp2 = false;
  for (const RankedLayout& r : search_layouts(deck, o, machine("cpu-local.toml"))) {
    const LayoutShape& L = r.input.layout;
    tp2pp2 = tp2pp2 || (L.holders == 0 && L.dp == 1 && L.tp == 2 && L.pp == 2);
  }
  EXPECT_TRUE(tp2pp2);
}

TEST(PlanSearch, LayoutsThatFitComeFirstOnGpuNodes) {
  // A 13B-like model on 2 H100 nodes: replicated or unsplit layouts overflow 80 GiB.
  const Deck deck = parse_deck("", "t.toml", {"model.n_layer=40", "model.n_head=40", "model.d_model=5120",
                                              "model.vocab_size=50257", "model.seq_len=2048",
                                              "train.batch_size=32", "train.precision=\"bf16\""});
  PlanOptions o;
  connect_plan_to_training(o);
  o.nodes = 2;
  const std::vector<RankedLayout> found = search_layouts(deck, o, machine("h100-sxm.toml"));
  expect_ranked(found);
  ASSERT_TRUE(found.front().prediction.fits());
  EXPECT_FALSE(found.back().prediction.fits());
  for (const RankedLayout& r : found) EXPECT_EQ(r.input.layout.compute(), 16);  // the GPUs
}

}  // namespace
}  // namespace pdtrain::plan
