// Bounded staleness, checked exactly: PD runs at pd.staleness 0, 1 and 2 (one holder and one
// compute rank, and two holders) against a hand-written reference of delayed AdamW. The
// reference uses the model's forward/backward (one GptStage holding the whole model, on the
// batch of each step) but its own optimizer and its own versioning:
//   version 0 = the initial parameters; step k takes the gradient of its batch on version
//   max(0, k-1-s), clips it by its global norm, and applies AdamW with the lr of step k (weight
//   decay on the parameters being updated) to version k-1, giving version k.
// With the remedies (pd/staleness.hpp) the reference adds: steps 1..warmup read version k-1;
// with a correction, a version v > 0 read by a delayed step (v >= warmup, not an evaluated
// version) is computed on as w_v + lead (w_v - w_{v-1}) + trend d_v, where d_v = -lr_v (m_v -
// m_{v-1}) / c1_v / (sqrt(v_v / c2_v) + eps) is what the change of the first moment at step v
// moved the parameters by (lead s + 1/2 and trend 0 for "predict", the table below for
// "trend"); with the bf16 wire every version read is rounded to bf16 first.
// The run writes a raw checkpoint after every step; every parameter and moment of version k
// is compared with the reference's. Runs under mpiexec with 3 ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "pdtrain/app/setup.hpp"
#include "pdtrain/core/bf16.hpp"
#include "pdtrain/app/train.hpp"
#include "pdtrain/ckpt/checkpoint.hpp"
#include "pdtrain/deck/deck.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "run_helpers.hpp"

namespace pdtrain::test {
namespace {

constexpr std::int64_t kSteps = 6;

// The tiny deck for 6 steps: warm-up over 3 (the lr changes every step), weight decay, and a
// clip low enough that some steps are clipped and others not.
std::string staleness_deck() {
  return tiny_deck({"run.steps=6", "optimizer.warmup_steps=3", "optimizer.weight_decay=0.1",
                    "optimizer.grad_clip=1.6"});
}

// Every block of the model, packed (catalog order): one parameter version, or a moment.
using Blocks = std::vector<std::vector<float>>;

// What the reference does about the delay (the deck's pd.staleness_warmup, pd.stale_correction
// and evaluation steps, pd.fetch_codec = bf16), written again here.
struct Coefficients {
  float lead = 0.0f, trend = 0.0f;
};
struct Remedy {
  std::int64_t warmup = 0;
  std::int64_t ramp = 0;            // pd.staleness_ramp
  const char* correction = "none";  // pd.stale_correction
  std::array<Coefficients, 3> at_delay{};  // what it means at delay 1, 2 and 3
  std::int64_t eval_every = 0;
  bool bf16_wire = false;
  bool corrected() const {
    for (const Coefficients& c : at_delay)
      if (c.lead != 0.0f || c.trend != 0.0f) return true;
    return false;
  }
};

// pd.stale_correction = "predict": lead d + 1/2 at delay d.
Remedy predicted(Remedy r = {}) {
  r.correction = "predict";
  r.at_delay = {{{1.5f, 0.0f}, {2.5f, 0.0f}, {3.5f, 0.0f}}};
  return r;
}
// pd.stale_correction = "trend": perf/staleness_stability.py's coefficients.
Remedy trended(Remedy r = {}) {
  r.correction = "trend";
  r.at_delay = {{{1.0f, 0.5f}, {0.75f, 2.25f}, {1.25f, 4.0f}}};
  return r;
}

// The reference: delayed AdamW written out, on the model's gradient.
class DelayedAdamW {
 public:
  DelayedAdamW(const Deck& deck, int staleness, Remedy remedy = {})
      : deck_(deck), s_(staleness), remedy_(remedy), setup_(make_setup(deck, MPI_COMM_SELF, false)),
        cat_(*setup_.catalog), params_(cat_, stage_spec(deck, setup_.shape, 0, 0)),
        B_(deck.train.batch_size), T_(deck.model.seq_len), stage_(params_, B_, T_, tp_) {
    Blocks init, zero;
    for (const BlockInfo& b : cat_.blocks()) {
      init.emplace_back(static_cast<std::size_t>(b.numel()));
      setup_.table.init(b.id, init.back().data());
      zero.emplace_back(static_cast<std::size_t>(b.numel()), 0.0f);
    }
    versions_.push_back(init);
    m_.push_back(zero);
    v_.push_back(zero);
    lr_.push_back(0.0);
  }

  // Steps 1..n.
  void train(std::int64_t n) {
    for (std::int64_t k = 1; k <= n; ++k) step(k);
  }
  const Blocks& version(std::int64_t k) const { return versions_.at(static_cast<std::size_t>(k)); }
  const Blocks& m() const { return m_.back(); }
  const Blocks& v() const { return v_.back(); }
  const ParamCatalog& catalog() const { return cat_; }
  std::vector<double> clip_scales;  // per step, to show that some steps were clipped

 private:
  void step(std::int64_t k) {
    const Blocks g = gradient(k, computed_on(read(k)));
    double sumsq = 0.0;
    for (const auto& blk : g)
      for (float x : blk) sumsq += static_cast<double>(x) * static_cast<double>(x);
    const double norm = std::sqrt(sumsq), clip = deck_.optimizer.grad_clip;
    const double scale = clip > 0.0 && norm > clip ? clip / (norm + 1e-6) : 1.0;
    clip_scales.push_back(scale);
    Blocks next = version(k - 1), m = m_.back(), v = v_.back();  // the newest are updated
    const auto& o = deck_.optimizer;
    const float b1 = static_cast<float>(o.beta1), b2 = static_cast<float>(o.beta2);
    const float c1 = static_cast<float>(1.0 - std::pow(o.beta1, static_cast<double>(k)));
    const float c2 = static_cast<float>(1.0 - std::pow(o.beta2, static_cast<double>(k)));
    const float lr = static_cast<float>(learning_rate(k)), eps = static_cast<float>(o.eps);
    const float sc = static_cast<float>(scale);
    for (const BlockInfo& b : cat_.blocks()) {
      const float wd =
          cat_.tensor(b.tensor).weight_decay ? static_cast<float>(o.weight_decay) : 0.0f;
      auto& p = next[b.id];
      auto& mb = m[b.id];
      auto& vb = v[b.id];
      for (std::size_t i = 0; i < p.size(); ++i) {
        const float gi = g[b.id][i] * sc;
        mb[i] = b1 * mb[i] + (1.0f - b1) * gi;
        vb[i] = b2 * vb[i] + (1.0f - b2) * gi * gi;
        const float mh = mb[i] / c1, vh = vb[i] / c2;
        p[i] -= lr * (mh / (std::sqrt(vh) + eps) + wd * p[i]);
      }
    }
    versions_.push_back(std::move(next));
    m_.push_back(std::move(m));
    v_.push_back(std::move(v));
    lr_.push_back(lr);
  }

  // The delay of step k: none in the warm-up, then s, or with a ramp 1 for `ramp` steps, 2 for
  // the next `ramp`, .. up to s.
  std::int64_t delay(std::int64_t k) const {
    if (k <= remedy_.warmup) return 0;
    if (remedy_.ramp == 0) return s_;
    const std::int64_t after = k - remedy_.warmup;  // 1, 2, ..
    return std::min<std::int64_t>(s_, (after + remedy_.ramp - 1) / remedy_.ramp);
  }
  std::int64_t read(std::int64_t k) const { return std::max<std::int64_t>(0, k - 1 - delay(k)); }

  // The parameters a step reading version v computes on: with a correction, extrapolated by
  // the coefficients of the delay of the last step that reads v.
  Blocks computed_on(std::int64_t v) const {
    Blocks w = version(v);
    const bool evaluated =
        v == deck_.run.steps || (remedy_.eval_every > 0 && v % remedy_.eval_every == 0);
    std::int64_t last_reader = 0;
    for (std::int64_t k = v + 1; k <= v + 1 + s_; ++k)
      if (read(k) == v) last_reader = k;
    const std::int64_t d = last_reader > 0 ? delay(last_reader) : 0;
    if (remedy_.corrected() && d > 0 && v > 0 && v >= remedy_.warmup && !evaluated) {
      const Coefficients f = remedy_.at_delay[static_cast<std::size_t>(d - 1)];
      const Blocks& before = version(v - 1);
      const auto& o = deck_.optimizer;
      const float c1 = static_cast<float>(1.0 - std::pow(o.beta1, static_cast<double>(v)));
      const float c2 = static_cast<float>(1.0 - std::pow(o.beta2, static_cast<double>(v)));
      const float lr = lr_[v], eps = static_cast<float>(o.eps);
      const Blocks &m = m_[v], &m_before = m_[v - 1], &sq = v_[v];
      for (std::size_t b = 0; b < w.size(); ++b)
        for (std::size_t i = 0; i < w[b].size(); ++i) {
          const float u_change = -lr * (((m[b][i] - m_before[b][i]) / c1) /
                                        (std::sqrt(sq[b][i] / c2) + eps));
          w[b][i] = w[b][i] + f.lead * (w[b][i] - before[b][i]) + f.trend * u_change;
        }
    }
    if (remedy_.bf16_wire)
      for (auto& blk : w)
        for (float& x : blk) x = to_float(to_bf16(x));
    return w;
  }

  // Linear warm-up to optimizer.lr, then cosine to min_lr at the last step (run.steps).
  double learning_rate(std::int64_t k) const {
    const auto& o = deck_.optimizer;
    const std::int64_t w = o.warmup_steps, total = deck_.run.steps;
    if (w > 0 && k <= w) return o.lr * static_cast<double>(k) / static_cast<double>(w);
    const double x = static_cast<double>(k - w) / static_cast<double>(total - w);
    return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1.0 + std::cos(3.141592653589793 * x));
  }

  // The gradient of step k's batch (mean loss over its tokens) at parameters `at`.
  Blocks gradient(std::int64_t k, const Blocks& at) {
    for (const BlockInfo& b : cat_.blocks()) params_.unpack_param(b, at[b.id].data());
    params_.upload_params();
    std::vector<std::int32_t> seq(static_cast<std::size_t>(B_ * (T_ + 1)));
    std::vector<std::int32_t> in(static_cast<std::size_t>(B_ * T_)), tgt(in.size());
    setup_.source->train_sequences(batch_of_step(k, {}), 0, B_, seq.data());
    data::split_inputs_targets(seq.data(), B_, T_, in.data(), tgt.data());
    params_.zero_grads();
    stage_.forward(0, in.data(), nullptr, tgt.data());
    stage_.take_loss_sum();
    stage_.backward(0, 1.0f / static_cast<float>(B_ * T_), nullptr);
    params_.download_grads();
    Blocks g;
    for (const BlockInfo& b : cat_.blocks()) {
      g.emplace_back(static_cast<std::size_t>(b.numel()));
      params_.pack_grad(b, g.back().data());
    }
    return g;
  }

  const Deck& deck_;
  const int s_;
  const Remedy remedy_;
  Setup setup_;
  const ParamCatalog& cat_;
  StageParams params_;
  const std::int64_t B_, T_;
  NoTensorParallel tp_;
  GptStage stage_;
  std::vector<Blocks> versions_, m_, v_;  // per version (moments after the step making it)
  std::vector<float> lr_;                 // per step
};

// The largest difference between `got` (a checkpoint's blocks) and `want`, with where it is.
struct Worst {
  double diff = 0.0;
  std::string where;
};
void compare(const char* what, const ParamCatalog& cat, const std::vector<float>& got,
             const std::vector<float>& want, int id, Worst& worst) {
  ASSERT_EQ(got.size(), want.size()) << what << " of block " << id;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i]));
    if (!(d <= worst.diff)) {  // NaN counts as the worst
      worst.diff = std::isnan(d) ? INFINITY : d;
      worst.where = std::string(what) + " " + std::to_string(i) + " of block " +
                    std::to_string(id) + " (" + cat.tensor(cat.block(id).tensor).name + "): " +
                    std::to_string(got[i]) + " vs reference " + std::to_string(want[i]);
    }
  }
}

// The run at `holders` holders and pd.staleness `s` on the first 1 + holders ranks; on rank 0,
// every step's checkpoint against the reference. Tolerance: the gradients are the model's own
// (bitwise those the compute rank pushes, one replica), and the update's arithmetic is written
// in the same order, but the reference adds the squares for the norm in a plain loop while the
// holders add per-block chunked sums: the clip factor may then differ in its last bit, which
// moves a parameter by about 1e-7 of its update (lr <= 1e-2). 1e-6 is far below what one
// version too early or too late changes (about the lr, 1e-3 to 1e-2, after one step).
// `extra`: deck changes that must not change a number (the reference ignores them).
// `remedy` must say what the deck changes in `extra` do (none: plain delayed AdamW).
void check_against_reference(int holders, int staleness, std::vector<std::string> extra = {},
                             Remedy remedy = {}) {
  const std::string tag = "h" + std::to_string(holders) + "-s" + std::to_string(staleness) +
                          (extra.empty() ? "" : "-" + std::to_string(extra.size()) + "x");
  const std::string dir = temp_path("stale-" + tag);
  if (world_rank() == 0) std::filesystem::remove_all(dir + "-0");
  MPI_Barrier(MPI_COMM_WORLD);
  const std::string deck_text = staleness_deck();
  std::vector<std::string> sets = {"parallel.holders=" + std::to_string(holders),
                                   "pd.staleness=" + std::to_string(staleness),
                                   "checkpoint.every=1", "checkpoint.keep=0",
                                   "checkpoint.codec=raw",
                                   "pd.staleness_warmup=" + std::to_string(remedy.warmup),
                                   "pd.staleness_ramp=" + std::to_string(remedy.ramp),
                                   std::string("pd.stale_correction=") + remedy.correction};
  sets.insert(sets.end(), extra.begin(), extra.end());
  first_group_run(deck_text, 1 + holders, sets, dir);
  if (world_rank() != 0) return;
  const Deck deck = parse_deck(deck_text, "test.toml", {});
  DelayedAdamW ref(deck, staleness, remedy);
  ref.train(kSteps);
  // A deliberately wrong variant of the correction (the trend dropped, or the lead one update
  // short) must be told apart from the run, or the comparison shows nothing about it.
  std::optional<DelayedAdamW> wrong;
  if (remedy.corrected()) {
    Remedy off = remedy;
    const bool trend = std::string(remedy.correction) == "trend";
    for (Coefficients& c : off.at_delay) (trend ? c.trend : c.lead) = trend ? 0.0f : c.lead - 1.0f;
    wrong.emplace(deck, staleness, off);
    wrong->train(kSteps);
  }
  int clipped = 0;
  for (double c : ref.clip_scales) clipped += c < 1.0;
  EXPECT_GT(clipped, 0) << "no step was clipped: the clip is not checked";
  EXPECT_LT(clipped, kSteps) << "every step was clipped: the unclipped path is not checked";
  const ParamCatalog& cat = ref.catalog();
  std::vector<int> ids;
  for (const BlockInfo& b : cat.blocks()) ids.push_back(b.id);
  for (std::int64_t k = 1; k <= kSteps; ++k) {
    char name[32];
    std::snprintf(name, sizeof name, "/ckpt-%08lld.h5", static_cast<long long>(k));
    const ckpt::Checkpoint c =
        ckpt::read_checkpoint(dir + "-0/checkpoints" + name, cat, MPI_COMM_SELF, ids);
    ASSERT_EQ(c.meta.version, k);
    Worst params, moments;
    for (int id : ids) {
      compare("parameter", cat, c.blocks.at(id).param, ref.version(k)[id], id, params);
      if (k == kSteps) {  // the reference keeps the newest moments only
        compare("m", cat, c.blocks.at(id).m, ref.m()[id], id, moments);
        compare("v", cat, c.blocks.at(id).v, ref.v()[id], id, moments);
      }
    }
    EXPECT_LE(params.diff, 1e-6) << tag << ", version " << k << ": worst " << params.where;
    if (k == kSteps && wrong) {
      Worst off;
      for (int id : ids) compare("parameter", cat, c.blocks.at(id).param, wrong->version(k)[id], id, off);
      EXPECT_GT(off.diff, 1e-4) << tag << ": the reference with the correction off by a term "
                                << "agrees with the run too: the check cannot see the correction";
      std::printf("%s: the wrong correction is off by %.3g\n", tag.c_str(), off.diff);
    }
    EXPECT_LE(moments.diff, 1e-6) << tag << ", version " << k << ": worst " << moments.where;
    std::printf("%s version %lld: largest parameter difference %.3g\n", tag.c_str(),
                static_cast<long long>(k), params.diff);
  }
}

TEST(Staleness, SynchronousRunIsPlainAdamW) { check_against_reference(1, 0); }
TEST(Staleness, OneStepDelayIsDelayedAdamW) { check_against_reference(1, 1); }
TEST(Staleness, TwoStepDelayIsDelayedAdamW) { check_against_reference(1, 2); }
TEST(Staleness, TwoHoldersOneStepDelay) { check_against_reference(2, 1); }
TEST(Staleness, TwoHoldersTwoStepDelay) { check_against_reference(2, 2); }
// Evaluations between steps (each waits for the newest version, then the next step goes back
// to an older one) and a cache too small for the stage (units evicted and fetched again in
// backward, at the step's version) change nothing.
TEST(Staleness, EvaluationsAndABoundedCacheKeepTheDelay) {
  check_against_reference(2, 2, {"train.eval_every=2", "pd.cache_mb=0.02", "pd.prefetch_depth=1"},
                          Remedy{.eval_every = 2});
}

// The remedies: prediction at one step of delay; a synchronous warm-up of 2 steps, then two
// steps of delay with prediction, two holders, and evaluations after steps 4 and 6 (versions
// 4 and 6 served exactly, 2, 3 and 5 predicted where a delayed step reads them); prediction on
// the bf16 wire (rounded after extrapolating) and on lz4 (extrapolated, then compressed). The
// same for the trend correction (the momentum's change extrapolated too), and the ramp: one
// synchronous step, delay 1 for steps 2-3, 2 from step 4 (version 1 is read by steps 3 and 4
// and served with delay 2's coefficients, version 2 by step 5 only).
TEST(Staleness, PredictedOneStepDelay) { check_against_reference(1, 1, {}, predicted()); }
TEST(Staleness, WarmUpThenPredictedTwoStepDelay) {
  check_against_reference(2, 2, {"train.eval_every=4"}, predicted({.warmup = 2, .eval_every = 4}));
}
TEST(Staleness, PredictedDelayOnTheBf16Wire) {
  check_against_reference(1, 1, {"pd.fetch_codec=bf16"}, predicted({.bf16_wire = true}));
}
TEST(Staleness, PredictedDelayOnTheLz4Wire) {
  check_against_reference(1, 2, {"pd.fetch_codec=lz4"}, predicted());
}
TEST(Staleness, TrendOneStepDelay) { check_against_reference(1, 1, {}, trended()); }
TEST(Staleness, WarmUpThenTrendTwoStepDelay) {
  check_against_reference(2, 2, {"train.eval_every=4"}, trended({.warmup = 2, .eval_every = 4}));
}
TEST(Staleness, TrendOnTheBf16Wire) {
  check_against_reference(1, 2, {"pd.fetch_codec=bf16"}, trended({.bf16_wire = true}));
}
TEST(Staleness, TrendOnTheLz4Wire) {
  check_against_reference(1, 2, {"pd.fetch_codec=lz4"}, trended());
}
TEST(Staleness, RampFromOneToTwoStepsOfDelay) {
  check_against_reference(1, 2, {}, trended({.warmup = 1, .ramp = 2}));
}
TEST(Staleness, RampWithPlainDelay) {
  check_against_reference(2, 2, {}, Remedy{.warmup = 1, .ramp = 2});
}

}  // namespace
}  // namespace pdtrain::test
