// Sweeps: points of the Cartesian product (first key slowest) or of zipped lists, their
// directory labels, the deck of a point, and bad [sweep] tables as deck errors with the line.
#include <gtest/gtest.h>

#include "pdtrain/core/error.hpp"
#include "pdtrain/deck/sweep.hpp"

namespace pdtrain {
namespace {

const char* kProduct = R"([run]
name = "s"
[sweep]
"optimizer.lr" = [1e-3, 3e-3, 1e-2]
model.n_layer = [1, 2]
)";

TEST(Sweep, ProductPointsFirstKeySlowest) {
  const Sweep s = parse_sweep(kProduct, "s.toml");
  ASSERT_EQ(s.points(), 6u);
  EXPECT_EQ(s.keys, (std::vector<std::string>{"optimizer.lr", "model.n_layer"}));
  EXPECT_EQ(s.label(0), "lr=0.001,n_layer=1");
  EXPECT_EQ(s.label(1), "lr=0.001,n_layer=2");
  EXPECT_EQ(s.label(5), "lr=0.01,n_layer=2");
}

TEST(Sweep, ZipTakesListsElementByElement) {
  const Sweep s = parse_sweep(R"([sweep]
mode = "zip"
"optimizer.lr" = [1e-3, 3e-3]
"model.n_layer" = [4, 8]
"data.source" = ["synthetic", "synthetic"]
)", "z.toml");
  ASSERT_EQ(s.points(), 2u);
  EXPECT_EQ(s.label(1), "lr=0.003,n_layer=8,source=synthetic");
}

TEST(Sweep, PointDeckAppliesSettingsAndNamesItsDirectory) {
  const Sweep s = parse_sweep(kProduct, "s.toml");
  const Deck d = sweep_point_deck(kProduct, "s.toml", {"run.steps=7"}, s, 3);
  EXPECT_EQ(d.optimizer.lr, 3e-3);
  EXPECT_EQ(d.model.n_layer, 2);
  EXPECT_EQ(d.run.steps, 7);
  EXPECT_EQ(d.run.out_dir, "runs/s/3-lr=0.003,n_layer=2");
  EXPECT_EQ(d.origin.at("optimizer.lr"), "sweep point 3");
  EXPECT_THROW(sweep_point_deck(kProduct, "s.toml", {}, s, 6), Error);
}

TEST(Sweep, NoSweepTableIsEmpty) {
  EXPECT_EQ(parse_sweep("[run]\nsteps = 3\n", "n.toml").points(), 0u);
}

void expect_deck_error(const char* text, const std::string& starts_with, const std::string& has) {
  try {
    parse_sweep(text, "bad.toml");
    FAIL() << "expected an error for:\n" << text;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::deck);
    const std::string m = e.what();
    EXPECT_EQ(m.rfind(starts_with, 0), 0u) << m;
    EXPECT_NE(m.find(has), std::string::npos) << m;
  }
}

TEST(Sweep, BadTablesAreDeckErrorsWithTheLine) {
  expect_deck_error("[sweep]\n\"optimizer.lr\" = [1e-3]\n\"model.n_layr\" = [1, 2]\n",
                    "bad.toml:3:", "unknown key 'model.n_layr' in [sweep]; did you mean 'model.n_layer'?");
  expect_deck_error("[sweep]\n\n\"optimizer.lr\" = []\n", "bad.toml:3:", "empty list");
  expect_deck_error("[sweep]\nmode = \"zip\"\n\"optimizer.lr\" = [1e-3, 2e-3]\n\"model.n_layer\" = [1]\n",
                    "bad.toml:4:", "has 1 values but sweep.optimizer.lr has 2");
  expect_deck_error("[sweep]\n\"model.n_layer\" = [1, \"two\"]\n", "bad.toml:2:", "expected an integer");
  expect_deck_error("[sweep]\n\"optimizer.lr\" = [-1.0]\n", "bad.toml:2:", "must be > 0");
  expect_deck_error("[sweep]\nmode = \"shuffle\"\n\"optimizer.lr\" = [1.0]\n", "bad.toml:2:", "sweep.mode");
  expect_deck_error("[sweep]\n\"optimizer.lr\" = 1e-3\n", "bad.toml:2:", "expected a list");
}

}  // namespace
}  // namespace pdtrain
