// Parameter trajectories (output.trajectory_every): the rows two holders write equal the norms
// of the parameters and of their change taken from per-step checkpoints of the same run, for
// every tensor and layer, at every N-th step and no other; `pdtrain summarize` draws one curve
// per tensor beside the loss curves.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "pdtrain/app/tools.hpp"
#include "pdtrain/io/summary.hpp"
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

struct Row {
  double param, update;
};

// (step, tensor) -> norms, from OUT/trajectories.csv.
std::map<std::pair<long, std::string>, Row> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "step,tensor,param_norm,update_norm,update_to_weight");
  std::map<std::pair<long, std::string>, Row> rows;
  while (std::getline(in, line)) {
    std::stringstream s(line);
    std::string step, name, p, u, ratio;
    std::getline(s, step, ','), std::getline(s, name, ','), std::getline(s, p, ',');
    std::getline(s, u, ','), std::getline(s, ratio, ',');
    rows[{std::stol(step), name}] = {std::stod(p), std::stod(u)};
    EXPECT_NEAR(std::stod(ratio), std::stod(u) / std::stod(p), 1e-6 * std::stod(ratio)) << line;
  }
  return rows;
}

TEST(Trajectories, HoldersRowsEqualNormsFromCheckpoints) {
  const std::string runs = temp_path("trajectories"), out = runs + "/pd";
  if (world_rank() == 0) std::filesystem::remove_all(runs);
  MPI_Barrier(MPI_COMM_WORLD);
  const Deck d = parse_deck(tiny_deck({"run.steps=4", "parallel.holders=2",
                                       "output.trajectory_every=2", "checkpoint.every=1",
                                       "checkpoint.keep=10", "checkpoint.codec=\"raw\""}),
                            "t.toml", {"run.out_dir=" + out});
  RunOptions o;
  o.verbose = false;
  run_training(d, MPI_COMM_WORLD, o);
  if (world_rank() != 0) return;
  const auto rows = read_rows(out + "/trajectories.csv");
  for (long step : {2L, 4L}) {
    const CheckpointParams now = read_params(out + "/checkpoints/ckpt-0000000" + std::to_string(step) + ".h5");
    const CheckpointParams before = read_params(out + "/checkpoints/ckpt-0000000" + std::to_string(step - 1) + ".h5");
    for (const TensorInfo& t : now.catalog.tensors())
      for (std::int64_t l = 0; l < t.layers; ++l) {
        const std::string name = (t.per_layer ? "h." + std::to_string(l) + "." : std::string()) + t.name;
        double p2 = 0, u2 = 0;
        for (std::int64_t i = 0; i < t.rows * t.cols; ++i) {
          const std::size_t k = static_cast<std::size_t>(t.offset + l * t.rows * t.cols + i);
          const double p = now.canonical[k], u = p - before.canonical[k];
          p2 += p * p, u2 += u * u;
        }
        const auto it = rows.find({step, name});
        ASSERT_NE(it, rows.end()) << "no row for step " << step << " " << name;
        EXPECT_NEAR(it->second.param, std::sqrt(p2), 1e-7 * std::sqrt(p2) + 1e-12) << step << " " << name;
        EXPECT_NEAR(it->second.update, std::sqrt(u2), 1e-6 * std::sqrt(u2) + 1e-12) << step << " " << name;
      }
  }
  for (const auto& [key, row] : rows) EXPECT_TRUE(key.first == 2 || key.first == 4) << key.first;
  summarize_runs(runs);
  std::ifstream svg(runs + "/trajectories-pd.svg");
  const std::string text{std::istreambuf_iterator<char>(svg), {}};
  std::size_t curves = 0;
  for (std::size_t at = 0; (at = text.find("<polyline", at)) != std::string::npos; ++at) ++curves;
  EXPECT_EQ(curves, 16u) << "one curve per llm.c tensor";
}

std::string file_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Like metrics.csv: a run restarted from step 3's checkpoint drops the rows written after it
// (steps 4 and 6) and writes them again, and a fresh run in the same directory starts the file
// anew; either way the file is the uninterrupted run's, row for row.
TEST(Trajectories, RestartKeepsRowsUpToItsCheckpointAndAFreshRunStartsAnew) {
  const std::string runs = temp_path("trajectories-restart");
  if (world_rank() == 0) std::filesystem::remove_all(runs);
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string text = tiny_deck({"run.steps=6", "parallel.holders=2",
                                      "output.trajectory_every=2", "checkpoint.every=3",
                                      "checkpoint.keep=0"});
  RunOptions o;
  o.verbose = false;
  const Deck once = parse_deck(text, "t.toml", {"run.out_dir=" + runs + "/once"});
  run_training(once, MPI_COMM_WORLD, o);
  const Deck twice = parse_deck(text, "t.toml", {"run.out_dir=" + runs + "/twice"});
  run_training(twice, MPI_COMM_WORLD, o);
  RunOptions from3 = o;
  from3.restart = runs + "/twice/checkpoints/ckpt-00000003.h5";
  run_training(twice, MPI_COMM_WORLD, from3);
  const Deck fresh = parse_deck(text, "t.toml", {"run.out_dir=" + runs + "/fresh"});
  run_training(fresh, MPI_COMM_WORLD, o);
  run_training(fresh, MPI_COMM_WORLD, o);
  if (world_rank() != 0) return;
  const std::string want = file_text(runs + "/once/trajectories.csv");
  std::set<long> steps;
  for (const auto& [key, row] : read_rows(runs + "/once/trajectories.csv")) steps.insert(key.first);
  ASSERT_EQ(steps, (std::set<long>{2, 4, 6}));
  EXPECT_EQ(file_text(runs + "/twice/trajectories.csv"), want);
  EXPECT_EQ(file_text(runs + "/fresh/trajectories.csv"), want);
}

}  // namespace
}  // namespace pdtrain::test
