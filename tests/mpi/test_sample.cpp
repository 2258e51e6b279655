// Sampling (`pdtrain sample`): a model that learned the synthetic copy task continues a prompt
// greedily by its rule; draws depend on the seed only; generation runs past the position table
// (the window slides) without error.
#include <gtest/gtest.h>
#include <mpi.h>

#include "pdtrain/app/sample.hpp"
#include "pdtrain/app/tools.hpp"
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

// The tiny deck's copy task at lag 1 (each token repeats the one before with probability 0.9),
// trained 40 steps; its final checkpoint's parameters.
const CheckpointParams& trained() {
  static const CheckpointParams p = [] {
    const std::string out = temp_path("sample-run");
    std::filesystem::remove_all(out);
    const Deck d = parse_deck(tiny_deck({"run.steps=40", "optimizer.lr=2e-2"}), "t.toml",
                              {"run.out_dir=" + out});
    RunOptions o;
    o.verbose = false;
    run_training(d, MPI_COMM_SELF, o);
    return read_params(out + "/checkpoints/ckpt-00000040.h5");
  }();
  return p;
}

class Sample : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world_rank() != 0) GTEST_SKIP() << "one-rank test";
  }
};

TEST_F(Sample, GreedyContinuationFollowsTheLearnedRule) {
  const CheckpointParams& p = trained();
  SampleSettings s;
  s.tokens = 12;
  s.temperature = 0;
  for (std::int32_t last : {3, 17, 30}) {
    const std::vector<std::int32_t> out = generate(p.catalog, p.canonical, {5, 9, last}, s);
    ASSERT_EQ(out.size(), 12u);
    for (std::int32_t t : out) EXPECT_EQ(t, last) << "lag-1 copy: the last token repeats";
  }
}

TEST_F(Sample, DrawsDependOnTheSeedOnly) {
  const CheckpointParams& p = trained();
  SampleSettings s;
  s.tokens = 40;
  s.temperature = 3.0;  // flat enough that tokens other than the copy are drawn
  const auto a = generate(p.catalog, p.canonical, {1}, s);
  const auto b = generate(p.catalog, p.canonical, {1}, s);
  s.seed = 7;
  const auto c = generate(p.catalog, p.canonical, {1}, s);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(Sample, RunsPastThePositionTable) {
  const CheckpointParams& p = trained();
  SampleSettings s;
  s.tokens = 3 * p.catalog.shape().max_seq_len;
  s.temperature = 0;
  const auto out = generate(p.catalog, p.canonical, {11}, s);
  ASSERT_EQ(static_cast<std::int64_t>(out.size()), s.tokens);
  EXPECT_EQ(out.back(), 11);
}

TEST_F(Sample, PromptOutsideTheVocabularyIsRefused) {
  const CheckpointParams& p = trained();
  try {
    generate(p.catalog, p.canonical, {1, 32}, SampleSettings{});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    EXPECT_NE(std::string(e.what()).find("prompt token 32 is outside the model's 32-token vocabulary"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pdtrain::test
