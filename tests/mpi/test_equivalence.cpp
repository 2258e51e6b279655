// The spine of the suite: the same tiny deck trained by one rank (replicated, holders = 0) and
// by parameter/compute-decoupled layouts gives the same loss at every step, and a layout run
// twice gives an identical params_crc32c. Runs under mpiexec with 4 ranks; expectations are
// computed so that every rank checks them.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>
#include <utility>

#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

const std::string kDeck = tiny_deck();

std::string out_dir(const std::string& tag) { return temp_path("eq-" + tag); }

// The single-rank replicated run, computed on rank 0 and shared with all ranks.
const RunOutcome& reference() {
  static const RunOutcome ref = first_group_run(kDeck, 1, {}, out_dir("ref"));
  return ref;
}

void expect_same_losses(const RunOutcome& got, double rel_tol) {
  const RunOutcome& ref = reference();
  ASSERT_EQ(got.losses.size(), 20u);
  ASSERT_EQ(ref.losses.size(), 20u);
  for (std::size_t s = 0; s < ref.losses.size(); ++s)
    EXPECT_NEAR(got.losses[s], ref.losses[s], rel_tol * std::abs(ref.losses[s]))
        << "step " << s + 1;
}

// Runs `sets` on groups of `size` ranks; returns the outcome of the group containing this rank
// (empty for ranks left out).
RunOutcome run_groups(int size, std::vector<std::string> sets, const std::string& tag) {
  return run_on_groups(kDeck, size, std::move(sets), out_dir(tag));
}

// Equal losses would prove little if the runs did not train: the reference must learn.
TEST(Equivalence, ReferenceLearns) {
  const RunOutcome& ref = reference();
  ASSERT_EQ(ref.losses.size(), 20u);
  EXPECT_LT(ref.losses.back(), ref.losses.front() - 0.5);
}

TEST(Equivalence, OneHolderOneCompute) {
  RunOutcome r = run_groups(2, {"parallel.holders=1"}, "h1dp1");
  if (!r.ran) return;
  expect_same_losses(r, 1e-5);
  // With one replica the holder applies the same gradients with the same arithmetic as the
  // single rank: decoupling changes nothing, bit for bit.
  EXPECT_EQ(r.losses, reference().losses);
  EXPECT_EQ(r.crc, reference().crc);
}

// metrics.csv of a run: its rows after the header, and whether the last has a validation loss.
std::pair<int, bool> metrics_rows(const std::string& dir) {
  std::ifstream f(dir + "/metrics.csv");
  std::string line, last;
  int rows = -1;  // the header
  while (std::getline(f, line)) ++rows, last = line;
  const std::size_t a = last.find(','), b = last.find(',', a + 1);  // step,loss,val_loss,...
  return {rows, a != std::string::npos && b != std::string::npos && b > a + 1};
}

// Two holders and two compute ranks, one holder and three, the replicated baseline on four.
// Every step's row reaches metrics.csv, whatever layout: the reporter learns each update's
// figures from the replies it gets (relayed ones included).
TEST(Equivalence, FourRankLayoutsFollowTheReference) {
  ASSERT_GE(world_size(), 4);
  for (const auto& [holders, tag] : {std::pair{"parallel.holders=2", "h2dp2"},
                                     {"parallel.holders=1", "h1dp3"},
                                     {"parallel.holders=0", "h0dp4"}}) {
    SCOPED_TRACE(tag);
    RunOutcome r = run_groups(4, {holders}, tag);
    if (r.ran) expect_same_losses(r, 1e-5);
    if (world_rank() == 0) {
      const auto [rows, last_has_val] = metrics_rows(out_dir(tag) + "-0");
      EXPECT_EQ(rows, 20);
      EXPECT_TRUE(last_has_val);
    }
  }
}

TEST(Equivalence, DecoupledEqualsReplicatedBitwiseAtSameDp) {
  ASSERT_GE(world_size(), 4);
  RunOutcome pd = run_groups(4, {"parallel.holders=1"}, "bw-pd");
  RunOutcome rep = run_groups(3, {"parallel.holders=0"}, "bw-rep");  // dp 3 on 3 ranks
  // Ranks 0-2 ran both; compare where both outcomes exist.
  if (!pd.ran || !rep.ran) return;
  EXPECT_EQ(pd.losses, rep.losses);
  EXPECT_EQ(pd.crc, rep.crc);
}

TEST(Equivalence, LosslessWireCodecsAreBitIdenticalToRaw) {
  ASSERT_GE(world_size(), 4);
  RunOutcome raw = run_groups(4, {"parallel.holders=1"}, "codec-raw");
  RunOutcome packed = run_groups(
      4, {"parallel.holders=1", "pd.fetch_codec=lz4", "pd.push_codec=zstd"}, "codec-lz4");
  if (!raw.ran) return;
  EXPECT_EQ(raw.losses, packed.losses);
  EXPECT_EQ(raw.crc, packed.crc);
}

// Fetches of one unit (`layer0`) a compute rank made, from its heat map.
std::int64_t layer0_fetches(const std::string& dir, int rank) {
  std::ifstream f(dir + "/pd_heat/rank-" + std::to_string(rank) + ".csv");
  std::string line;
  std::getline(f, line);  // header: block,name,unit,bytes,uses,fetches
  while (std::getline(f, line))
    if (line.find(",layer0,") != std::string::npos) return std::stoll(line.substr(line.rfind(',') + 1));
  return -1;
}

// Prefetch depth and the cache limit change when blocks move, never what they hold: the runs
// are bit-identical to the single rank (dp 1) and to the default settings (dp 3, relayed).
TEST(Equivalence, PrefetchAndBoundedCacheAreBitIdentical) {
  ASSERT_GE(world_size(), 4);
  RunOutcome dp3 = run_groups(4, {"parallel.holders=1"}, "cache-default");
  // 0.02 MiB holds one layer of this model (0.0125 MiB) but not two: layers are re-fetched.
  const std::vector<std::vector<std::string>> settings = {
      {"pd.prefetch_depth=0"},
      {"pd.prefetch_depth=1", "pd.cache_mb=0.02"},
      {"pd.prefetch_depth=5", "pd.cache_mb=0.02"},
      {"pd.prefetch_depth=8"},
      {"pd.prefetch_depth=3", "pd.fetch_thread=true"},  // a background thread moves fetches
      {"pd.prefetch_depth=2", "pd.cache_mb=0.02", "pd.fetch_thread=true"},
      {"pd.prefetch_depth=2", "pd.cache_mb=0.02", "pd.cache_warm_steps=5"},  // cold start
      // Backward waits for each push; with one replica a layer goes from its tiles, unpacked.
      {"pd.prefetch_depth=2", "pd.cache_mb=0.02", "pd.pushes_in_flight=0"}};
  for (std::size_t i = 0; i < settings.size(); ++i) {
    std::vector<std::string> sets = settings[i];
    sets.push_back("parallel.holders=1");
    const std::string tag = "cache" + std::to_string(i);
    RunOutcome one = run_groups(2, sets, tag + "-dp1");
    if (one.ran) {
      EXPECT_EQ(one.losses, reference().losses) << i;
      EXPECT_EQ(one.crc, reference().crc) << i;
    }
    RunOutcome three = run_groups(4, sets, tag + "-dp3");
    if (three.ran) {
      EXPECT_EQ(three.losses, dp3.losses) << i;
      EXPECT_EQ(three.crc, dp3.crc) << i;
    }
    // The dp-1 run's compute rank: layer0 used twice per step, 20 steps.
    if (world_rank() == 1) {
      const std::int64_t fetches = layer0_fetches(out_dir(tag + "-dp1-0"), 1);
      const bool bounded = std::find(settings[i].begin(), settings[i].end(),
                                     std::string("pd.cache_mb=0.02")) != settings[i].end();
      if (bounded)
        EXPECT_GT(fetches, 20) << i;  // evicted between forward and backward
      else
        EXPECT_EQ(fetches, 20 + 1) << i;  // once per version, plus the final evaluation's
    }
  }
}

// Layer-major order runs every micro-batch through a layer before the next: with a cache that
// holds one layer, a step fetches each layer once per direction (micro-batch order: once per
// micro-batch and direction). The numbers differ from micro-batch order only in the order the
// tied embedding adds its micro-batches' gradients; PD and the baseline in layer-major order
// are bit-identical.
TEST(Equivalence, LayerMajorOrderFetchesEachLayerOncePerDirection) {
  ASSERT_GE(world_size(), 4);
  const std::vector<std::string> layer = {"parallel.micro_batches=2", "parallel.order=layer"};
  auto with = [&](std::vector<std::string> sets, const std::vector<std::string>& more) {
    sets.insert(sets.end(), more.begin(), more.end());
    return sets;
  };
  const std::vector<std::string> pd = {"parallel.holders=1", "pd.cache_mb=0.02",
                                       "pd.prefetch_depth=2"};
  RunOutcome base1 = first_group_run(kDeck, 1, with(layer, {"parallel.holders=0"}),
                                     out_dir("lm-base1"));
  RunOutcome pd1 = run_groups(2, with(layer, pd), "lm-pd1");
  RunOutcome mb1 = run_groups(2, with(pd, {"parallel.micro_batches=2"}), "lm-mb1");
  if (pd1.ran) {
    EXPECT_EQ(pd1.losses, base1.losses);
    EXPECT_EQ(pd1.crc, base1.crc);
    expect_same_losses(pd1, 1e-5);
  }
  RunOutcome base3 = run_groups(3, with(layer, {"parallel.holders=0"}), "lm-base3");
  RunOutcome pd3 = run_groups(4, with(layer, pd), "lm-pd3");
  if (pd3.ran && base3.ran) {
    EXPECT_EQ(pd3.losses, base3.losses);
    EXPECT_EQ(pd3.crc, base3.crc);
  }
  if (world_rank() == 1) {  // the dp-1 runs' compute rank; 20 steps and a final evaluation
    const std::int64_t layer_major = layer0_fetches(out_dir("lm-pd1-0"), 1);
    const std::int64_t micro_batch = layer0_fetches(out_dir("lm-mb1-0"), 1);
    EXPECT_LE(layer_major, 2 * 20 + 2);  // forward and backward, and the evaluation's 2
    EXPECT_GE(micro_batch, 3 * 20);      // about 2 per micro-batch
  }
}

// On several nodes the holders move to other ranks and blocks to holders near their fetchers;
// the numbers (losses, canonical CRC) must not notice. Nodes are faked: 2 ranks per node.
TEST(Equivalence, HoldersSpreadOverNodesChangeNothing) {
  ASSERT_GE(world_size(), 4);
  const std::vector<std::string> sets = {"parallel.holders=2", "parallel.pp=2",
                                         "parallel.micro_batches=2"};
  RunOutcome one_node = run_groups(4, sets, "nodes-1");
  setenv("PDTRAIN_TEST_RANKS_PER_NODE", "2", 1);
  RunOutcome two_nodes = run_groups(4, sets, "nodes-2");
  setenv("PDTRAIN_TEST_RANKS_PER_NODE", "1", 1);  // every rank its own node
  RunOutcome four_nodes = run_groups(4, sets, "nodes-4");
  unsetenv("PDTRAIN_TEST_RANKS_PER_NODE");
  if (!one_node.ran) return;
  EXPECT_EQ(two_nodes.losses, one_node.losses);
  EXPECT_EQ(two_nodes.crc, one_node.crc);
  EXPECT_EQ(four_nodes.losses, one_node.losses);
  EXPECT_EQ(four_nodes.crc, one_node.crc);
}

// Fetched blocks copied from a holder's shared segment (pd.fetch_path = auto, the default on a
// node) or sent as MPI messages (mpi) are the same bits: with the versions staleness keeps
// (slots reused in turn), the bf16 wire, tensor-parallel slabs, the data-parallel relay, and
// holders on other (faked) nodes fetched by message beside a local one.
TEST(Equivalence, FetchPathsAreBitIdentical) {
  ASSERT_GE(world_size(), 4);
  const std::vector<std::vector<std::string>> variants = {
      {"parallel.holders=2", "parallel.pp=2", "parallel.micro_batches=2"},
      {"parallel.holders=1", "pd.staleness=2", "pd.staleness_warmup=0", "pd.staleness_ramp=0"},
      {"parallel.holders=2", "parallel.tp=2", "pd.fetch_codec=bf16", "pd.staleness=1",
       "pd.staleness_warmup=0"}};
  for (std::size_t i = 0; i < variants.size(); ++i)
    for (const char* per_node : {"", "2"}) {
      if (*per_node) setenv("PDTRAIN_TEST_RANKS_PER_NODE", per_node, 1);
      const std::string tag = "path" + std::to_string(i) + per_node;
      std::vector<std::string> shared = variants[i], message = variants[i];
      message.push_back("pd.fetch_path=mpi");
      RunOutcome a = run_groups(4, shared, tag + "a");
      RunOutcome b = run_groups(4, message, tag + "m");
      unsetenv("PDTRAIN_TEST_RANKS_PER_NODE");
      if (!a.ran) continue;
      ASSERT_EQ(a.losses.size(), 20u) << tag;
      EXPECT_EQ(a.losses, b.losses) << tag;
      EXPECT_EQ(a.crc, b.crc) << tag;
    }
}

// A holder's threads change how its update is spread over cores, never a bit. The model is
// wider than the tiny deck's so that blocks span several update slices (a wte block is 4), for
// each way a holder encodes (raw in place, raw copies kept for staleness and predicted, bf16,
// lz4, bf16 predicted), and with the tied embedding pushed by two pipeline stages to two
// holders.
TEST(Equivalence, HolderThreadsAreBitIdentical) {
  ASSERT_GE(world_size(), 4);
  const std::string wide =
      tiny_deck({"model.d_model=128", "model.vocab_size=512", "run.steps=6"});
  const std::vector<std::vector<std::string>> variants = {
      {"parallel.holders=1"},
      {"parallel.holders=1", "pd.staleness=1", "pd.staleness_warmup=0"},
      {"parallel.holders=1", "pd.fetch_codec=bf16"},
      {"parallel.holders=1", "pd.fetch_codec=lz4"},
      {"parallel.holders=1", "pd.staleness=1", "pd.staleness_warmup=0", "pd.fetch_codec=bf16"}};
  for (std::size_t i = 0; i < variants.size(); ++i) {
    RunOutcome by_threads[3];
    for (int t = 1; t <= 3; ++t) {
      std::vector<std::string> sets = variants[i];
      sets.push_back("pd.holder_threads=" + std::to_string(t));
      by_threads[t - 1] = run_on_groups(wide, 2, sets,
                                        out_dir("threads" + std::to_string(i) + std::to_string(t)));
    }
    if (!by_threads[0].ran) continue;
    ASSERT_EQ(by_threads[0].losses.size(), 6u);
    for (int t = 2; t <= 3; ++t) {
      EXPECT_EQ(by_threads[t - 1].losses, by_threads[0].losses) << i << " threads " << t;
      EXPECT_EQ(by_threads[t - 1].crc, by_threads[0].crc) << i << " threads " << t;
    }
  }
  const std::vector<std::string> tied = {"parallel.holders=2", "parallel.pp=2",
                                         "parallel.micro_batches=2"};
  std::vector<std::string> one = tied, two = tied;
  one.push_back("pd.holder_threads=1");
  two.push_back("pd.holder_threads=2");
  RunOutcome a = run_on_groups(wide, 4, one, out_dir("threads-tied1"));
  RunOutcome b = run_on_groups(wide, 4, two, out_dir("threads-tied2"));
  if (!a.ran) return;
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.crc, b.crc);
}

// Waiting for each push (pd.pushes_in_flight = 0: a layer's gradient sent from its tiles,
// row-parallel weights' column slabs among them) or keeping two on the wire changes nothing.
TEST(Equivalence, PushesInFlightAreBitIdentical) {
  ASSERT_GE(world_size(), 4);
  const std::vector<std::string> tp2 = {"parallel.holders=1", "parallel.tp=2",
                                        "parallel.micro_batches=2"};
  RunOutcome by_count[3];
  for (int n = 0; n <= 2; ++n) {
    std::vector<std::string> sets = tp2;
    sets.push_back("pd.pushes_in_flight=" + std::to_string(n));
    by_count[n] = run_groups(3, sets, "in-flight" + std::to_string(n));
  }
  if (!by_count[0].ran) return;
  ASSERT_EQ(by_count[1].losses.size(), 20u);
  for (int n : {0, 2}) {
    EXPECT_EQ(by_count[n].losses, by_count[1].losses) << n << " in flight";
    EXPECT_EQ(by_count[n].crc, by_count[1].crc) << n << " in flight";
  }
}

TEST(Reproducibility, BoundedStalenessIsReproducible) {
  // Step k always computes on version max(0, k-1-s) whatever the message timing, so a stale
  // run is as reproducible as a synchronous one, and still learns.
  ASSERT_GE(world_size(), 4);
  // Without a warm-up or a ramp, so that the run's few steps are delayed (and predicted).
  for (const char* s : {"pd.staleness=1", "pd.staleness=3"}) {
    const std::vector<std::string> sets = {"parallel.holders=2", s, "pd.staleness_warmup=0",
                                           "pd.staleness_ramp=0"};
    RunOutcome a = run_groups(4, sets, std::string("ssp-a") + s[12]);
    RunOutcome b = run_groups(4, sets, std::string("ssp-b") + s[12]);
    if (!a.ran) continue;
    EXPECT_EQ(a.crc, b.crc) << s;
    EXPECT_EQ(a.losses, b.losses) << s;
    EXPECT_NE(a.crc, reference().crc) << s;  // stale gradients: a different trajectory
    EXPECT_EQ(a.losses[0], reference().losses[0]) << s;  // step 1 uses version 0 either way
    EXPECT_LT(a.losses.back(), a.losses.front() - 0.3) << s;
  }
}

TEST(Reproducibility, LossyBf16WireIsCloseAndReproducible) {
  ASSERT_GE(world_size(), 4);
  const std::vector<std::string> bf16 = {"parallel.holders=2", "pd.fetch_codec=bf16",
                                         "pd.push_codec=bf16"};
  RunOutcome a = run_groups(4, bf16, "bf16-a");
  RunOutcome b = run_groups(4, bf16, "bf16-b");
  if (!a.ran) return;
  EXPECT_EQ(a.crc, b.crc);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_NE(a.crc, reference().crc);  // it is lossy...
  for (std::size_t s = 0; s < a.losses.size(); ++s)  // ...but bf16 weights train the same way
    EXPECT_NEAR(a.losses[s], reference().losses[s], 0.05 * reference().losses[s]) << s + 1;
}

TEST(Reproducibility, SamePdRunTwiceGivesIdenticalCrc) {
  ASSERT_GE(world_size(), 4);
  RunOutcome a = run_groups(4, {"parallel.holders=1"}, "rep-a");
  RunOutcome b = run_groups(4, {"parallel.holders=1"}, "rep-b");
  if (!a.ran) return;
  EXPECT_EQ(a.crc, b.crc);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_NE(a.crc, 0u);
}

}  // namespace
}  // namespace pdtrain::test
