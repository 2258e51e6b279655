// `pdtrain plan` models the run training would make: it refuses what training's set-up refuses
// (with the set-up's own checks), splits layers as training does, counts PD gradients with
// GradStreamer's bound (pd.pushes_in_flight included) and takes the collectives' transport from
// parallel.comm as a run resolves it.
#include <gtest/gtest.h>

#include "pdtrain/app/report.hpp"
#include "pdtrain/app/setup.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/plan/command.hpp"

namespace pdtrain::plan {
namespace {

Machine machine(const char* file) { return load_machine(std::string(PDTRAIN_SOURCE_DIR "/machines/") + file); }

// What main hands the plan: the streamer's bound and the set-up's checks.
PlanOptions training_options(int ranks = 0, int nodes = 0) {
  PlanOptions o;
  o.ranks = ranks;
  o.nodes = nodes;
  connect_plan_to_training(o);
  return o;
}

const std::vector<std::string> kSmall = {"model.n_layer=4", "model.n_head=4", "model.d_model=64",
                                         "model.vocab_size=256", "model.seq_len=32", "train.batch_size=8"};

Deck deck_with(std::vector<std::string> sets) {
  std::vector<std::string> all = kSmall;
  all.insert(all.end(), sets.begin(), sets.end());
  return parse_deck("", "t.toml", all);
}

// The Error `f` throws (fails the test if it throws none).
template <class F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "no Error thrown";
  return Error(ExitCode::runtime, "");
}

TEST(PlanAsTraining, RefusesACacheTooSmallForAStageAsTheSetUpDoes) {
  const Deck deck = deck_with({"pd.cache_mb=0.01"});
  const Error e = error_of([&] { checked_input(deck, training_options(2), machine("cpu-local.toml")); });
  EXPECT_EQ(e.code(), ExitCode::deck);
  EXPECT_NE(std::string(e.what()).find("pd.cache_mb: 0.01 MiB cannot hold one use of pipeline stage 0"),
            std::string::npos)
      << e.what();
  // The set-up's own check says the same (one implementation).
  const Error setup = error_of([&] { check_layout(deck, resolve_layout(deck, 2), {0, 0}); });
  EXPECT_STREQ(setup.what(), e.what());
  // A cache that holds the largest use passes.
  EXPECT_NO_THROW(checked_input(deck_with({"pd.cache_mb=1"}), training_options(2), machine("cpu-local.toml")));
}

TEST(PlanAsTraining, RefusesAHolderThatWouldOwnNoBlock) {
  // One layer of one head has 20 parameter blocks: 24 holders cannot all own one.
  const Deck deck = parse_deck("", "t.toml", {"model.n_layer=1", "model.n_head=1", "model.d_model=16",
                                              "model.vocab_size=64", "model.seq_len=16", "train.batch_size=1",
                                              "parallel.holders=24"});
  const Error e = error_of([&] { checked_input(deck, training_options(25), machine("cpu-local.toml")); });
  EXPECT_EQ(e.code(), ExitCode::layout);
  const std::string what = e.what();
  EXPECT_NE(what.find("parallel.holders: holder "), std::string::npos) << what;
  EXPECT_NE(what.find(" would own no parameter block (the model has 20 blocks)"), std::string::npos) << what;
}

TEST(PlanAsTraining, SearchListsOnlyLayoutsTheSetUpAccepts) {
  // 0.15 MiB holds a layer's tp shard at tp >= 2 (0.10 MiB) but not a whole layer (0.19 MiB).
  const Deck deck = deck_with({"pd.cache_mb=0.15"});
  bool tp2 = false;
  for (const RankedLayout& r : search_layouts(deck, training_options(6), machine("cpu-local.toml"))) {
    const LayoutShape& L = r.input.layout;
    EXPECT_TRUE(L.holders == 0 || L.tp >= 2) << L.holders << " holders, tp " << L.tp << ", pp " << L.pp;
    tp2 = tp2 || (L.holders > 0 && L.tp >= 2);
  }
  EXPECT_TRUE(tp2);
}

TEST(PlanAsTraining, StagesSplitTheLayersAsTrainingDoes) {
  for (int pp : {2, 3, 5}) {
    const Deck deck = deck_with({"model.n_layer=7", "parallel.pp=" + std::to_string(pp), "parallel.dp=1"});
    const PlanInput in = checked_input(deck, training_options(), machine("cpu-local.toml"));
    const Prediction p = predict(in, machine("cpu-local.toml"));
    ASSERT_EQ(static_cast<int>(p.stages.size()), pp);
    for (int s = 0; s < pp; ++s) {
      const StageSpec train = stage_spec(deck, in.layout, s, 0);
      EXPECT_EQ(p.stages[static_cast<std::size_t>(s)].layers, train.layer_end - train.layer_begin) << pp << " " << s;
      const StageSpec split = split_stage(7, pp, s, 1, 0);
      EXPECT_EQ(split.layer_begin, train.layer_begin);
      EXPECT_EQ(split.layer_end, train.layer_end);
    }
  }
}

TEST(PlanAsTraining, PdGradientsAreTheStreamersBoundWithItsPushesInFlight) {
  const Machine cpu = machine("cpu-local.toml");
  auto grads = [&](const char* in_flight) {
    const Deck deck = deck_with({"parallel.pp=1", std::string("pd.pushes_in_flight=") + in_flight});
    const PlanInput in = checked_input(deck, training_options(2), cpu);
    const double g = predict(in, cpu).stages[0].memory.grads;
    EXPECT_DOUBLE_EQ(g, pd_grad_bound(deck, in.layout)(0)) << in_flight;
    return g;
  };
  // No push in flight holds one layer less than two in flight (pd.pushes_in_flight's description).
  EXPECT_LT(grads("0"), grads("2"));
  // The library has no estimate of its own: without the bound a PD layout is refused.
  PlanInput bare = plan_input(deck_with({}), {1, 1, 1, 1}, 1);
  EXPECT_EQ(error_of([&] { predict(bare, cpu); }).code(), ExitCode::runtime);
}

TEST(PlanAsTraining, CollectivesFollowParallelComm) {
  const Machine h100 = machine("h100-sxm.toml");
  // {tensor-parallel all-reduces staged, pipeline and data-parallel traffic staged}
  auto staged = [&](const char* comm, bool nccl_flag) {
    PlanOptions o = training_options(0, 1);
    o.nccl = nccl_flag;
    const Deck deck = deck_with({"parallel.tp=4", std::string("parallel.comm=\"") + comm + "\""});
    const PlanInput in = checked_input(deck, o, h100);
    return std::pair{in.tp_host_staged, in.host_staged};
  };
  EXPECT_EQ(staged("nccl", false), std::pair(false, false));  // a run's NCCL carries every group
  EXPECT_EQ(staged("mpi", false), std::pair(true, true));
  EXPECT_EQ(staged("auto", false), std::pair(false, false));  // every compute rank has its own GPU
  EXPECT_EQ(staged("mpi", true), std::pair(false, false));    // --nccl: as if parallel.comm = nccl
  // Host staging costs time: the same layout through host memory is slower.
  PlanOptions o = training_options(0, 1);
  const Prediction mpi = predict(checked_input(deck_with({"parallel.tp=4", "parallel.comm=\"mpi\""}), o, h100), h100);
  const Prediction nccl = predict(checked_input(deck_with({"parallel.tp=4", "parallel.comm=\"nccl\""}), o, h100), h100);
  EXPECT_GT(mpi.step.total, nccl.step.total);
  // A CPU machine has no GPU for NCCL: refused as training refuses it, naming the key.
  const Error e = error_of([&] {
    checked_input(deck_with({"parallel.comm=\"nccl\""}), training_options(2), machine("cpu-local.toml"));
  });
  EXPECT_EQ(e.code(), ExitCode::deck);
  EXPECT_NE(std::string(e.what()).find("parallel.comm: nccl, but"), std::string::npos) << e.what();
}

}  // namespace
}  // namespace pdtrain::plan
