// Single-rank training speed against the SGEMM ceiling of the same machine.
//
// Builds each model through the real code path (ParamCatalog -> BlockTable -> DeviceReplica,
// StageParams, GptStage with NoTensorParallel) and times whole training steps exactly as the
// replicated baseline runs them on one rank: fetch (unpack blocks), zero gradients, forward,
// backward, pack gradients, push (global norm + AdamW over every parameter). It reports
// tokens/s, the achieved model GFLOP/s and that as a fraction of one large square SGEMM
// measured in the same run with the same BLAS and thread count.
//
// Model FLOPs of one step (B sequences of T tokens, L layers, width C, V real vocabulary rows):
//   6 * B*T * (12*L*C^2 + V*C)   every weight matrix (qkv 3C^2, attproj C^2, fc 4C^2, fcproj
//                                4C^2 per layer; the tied LM head V*C) once forward (2 FLOPs
//                                per multiply-add) and twice backward (input and weight grads)
// + 6 * L * B * T^2 * C          attention: QK^T and att.V are 2*B*T^2*C each per layer
//                                forward counting the causal lower triangle only (half of
//                                4*B*T^2*C), and twice that backward.
// Element-wise work (LayerNorm, GELU, softmax, cross-entropy, AdamW) counts as zero FLOPs.
//
// Usage: bench_single_rank [--short] [--model 124M|small|all] [--steps N] [--warmup N]
//                          [--threads N] [--lanes 4|8] [--profile]
//   --short    tiny model, 1 step: checks the FLOP formula against hand-computed numbers and
//              that the ratio line is printed and consistent (the ctest perf.*_short).
//   --threads  BLAS threads (default 2, this machine's cores).
//   --lanes    force the 4-lane (SSE2) or 8-lane (AVX2, if the CPU has it) float exp/GELU
//              code; default: the widest the CPU supports.
//   --profile  per-kernel time (Kokkos kernels by label, GEMMs by shape) over the timed steps,
//              and the optimizer's two parts timed alone.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pdtrain/core/rng.hpp"
#include "pdtrain/kernels/blas_runtime.hpp"
#include "pdtrain/kernels/gemm.hpp"
#include "pdtrain/kernels/gpt_kernels.hpp"
#include "pdtrain/kernels/kernel_profile.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/pd/device_replica.hpp"

namespace {

using pdtrain::BlockInfo;
using pdtrain::ModelShape;
using pdtrain::ParamCatalog;

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct ModelCase {
  const char* name;
  std::int64_t n_layer, d_model, n_head, vocab, batch, seq_len;
};

// ---------------------------------------------------------------------------------------------
// FLOP accounting (see the header comment).

double matmul_params(const ModelCase& m) {
  const double L = m.n_layer, C = m.d_model, V = m.vocab;
  return 12.0 * L * C * C + V * C;
}
double model_flops(const ModelCase& m) {
  const double tokens = double(m.batch) * m.seq_len;
  const double attention = 6.0 * m.n_layer * m.batch * double(m.seq_len) * m.seq_len * m.d_model;
  return 6.0 * tokens * matmul_params(m) + attention;
}
// The same count of weight-matrix parameters read off the catalogue (real vocabulary rows of
// wte only: the head skips padding rows), to check the formula against the model's tensors.
double catalog_matmul_params(const ParamCatalog& cat) {
  double n = 0;
  for (const auto& t : cat.tensors()) {
    using pdtrain::TensorId;
    if (t.id == TensorId::qkvw || t.id == TensorId::attprojw || t.id == TensorId::fcw ||
        t.id == TensorId::fcprojw)
      n += double(t.numel());
  }
  return n + double(cat.shape().vocab_size) * cat.shape().d_model;
}

// Per-kernel profile (--profile): kernels::KernelProfile, Kokkos' tool callbacks.
pdtrain::kernels::KernelProfile* g_profile = nullptr;  // owned by main, inside Kokkos' scope
void record_profile(bool on) {
  if (g_profile) g_profile->record(on);
}

// ---------------------------------------------------------------------------------------------
// The SGEMM ceiling: C = A * B for square n, best of `reps` after one warm-up.

double sgemm_gflops(int n, int reps) {
  std::vector<float> a(std::size_t(n) * n), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = float(pdtrain::rng_normal(pdtrain::rng_key(71), i));
    b[i] = float(pdtrain::rng_normal(pdtrain::rng_key(72), i));
  }
  double best = 1e30;
  for (int r = 0; r <= reps; ++r) {
    const double t0 = now();
    pdtrain::kernels::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                           n);
    const double dt = now() - t0;
    if (r > 0) best = std::min(best, dt);
  }
  return 2.0 * n * double(n) * n / best * 1e-9;
}


// ---------------------------------------------------------------------------------------------
// One model: set-up through the real code path, warm-up steps, timed steps.

struct Phases {
  double fetch = 0, zero = 0, forward = 0, backward = 0, pack = 0, push = 0;
  double total() const { return fetch + zero + forward + backward + pack + push; }
};

struct Result {
  double step_s = 0, fwdbwd_s = 0, min_step_s = 0, loss_first = 0, loss_last = 0;
  double opt_params = 0, opt_sumsq_s = 0, opt_adamw_s = 0;  // --profile only
  Phases phases;
};

Result run_model(const ModelCase& mc, int warmup, int steps, bool profile) {
  pdtrain::ModelConfig cfg;
  cfg.n_layer = mc.n_layer;
  cfg.n_head = mc.n_head;
  cfg.d_model = mc.d_model;
  cfg.vocab_size = mc.vocab;
  cfg.seq_len = mc.seq_len;
  const ModelShape shape = pdtrain::resolve_model_shape(cfg);
  const ParamCatalog cat(shape);
  pdtrain::StageParams params(cat, pdtrain::StageSpec{0, shape.n_layer, true, true, 1, 0});

  // The replicated baseline's parameter service: it owns every block and its AdamW state.
  pdtrain::BlockTable table;
  for (const BlockInfo& b : cat.blocks())
    table.blocks.push_back({b.numel(), cat.tensor(b.tensor).weight_decay, cat.block_name(b)});
  table.init = [&cat](int id, float* out) { cat.init_block(cat.block(id), 0.02, 1337, out); };
  table.canonical_crc = [](const std::vector<const float*>&) { return std::uint32_t(0); };
  pdtrain::AdamWConfig opt;
  opt.lr = 1e-4;
  opt.weight_decay = 0.1;
  opt.grad_clip = 1.0;
  opt.total_steps = warmup + steps;
  pdtrain::DeviceReplica replica(table, opt, pdtrain::cpu_device(),
                                 pdtrain::kernels::cpu_kernel_ops());
  auto fetch = [&](std::int64_t version, const std::vector<int>& ids,
                   const pdtrain::ParameterService::BlockSink& sink) {
    replica.fetch(version, ids, sink);
  };
  auto push = [&](std::int64_t step, const std::vector<int>& ids, const float* grads) {
    replica.push(step, ids, grads);
  };

  pdtrain::NoTensorParallel tp;
  pdtrain::GptStage stage(params, mc.batch, mc.seq_len, tp);
  const std::int64_t N = mc.batch * mc.seq_len;
  std::vector<std::int32_t> tokens(N), targets(N);
  std::vector<float> packed(static_cast<std::size_t>(params.numel()));
  const std::vector<int>& blocks = params.needed_blocks();

  Result res;
  std::vector<Phases> timed_steps;
  for (int s = 1; s <= warmup + steps; ++s) {
    const bool timed = s > warmup;
    record_profile(profile && timed);
    for (std::int64_t i = 0; i < N; ++i) {  // the batch of step s (not timed)
      tokens[i] = std::int32_t(pdtrain::rng_below(pdtrain::rng_key(5, s), i, mc.vocab));
      targets[i] = std::int32_t(pdtrain::rng_below(pdtrain::rng_key(6, s), i, mc.vocab));
    }
    Phases p;
    double t = now(), t1;
    fetch(s - 1, blocks, [&](int id, const float* d) {
      params.unpack_param(cat.block(id), d);
    });
    params.upload_params();
    t1 = now(), p.fetch = t1 - t, t = t1;
    params.zero_grads();
    t1 = now(), p.zero = t1 - t, t = t1;
    stage.forward(0, tokens.data(), nullptr, targets.data());
    const double loss = stage.take_loss_sum() / double(N);
    t1 = now(), p.forward = t1 - t, t = t1;
    stage.backward(0, 1.0f / float(N), nullptr);
    t1 = now(), p.backward = t1 - t, t = t1;
    params.download_grads();
    float* g = packed.data();
    for (int b : blocks) {
      params.pack_grad(cat.block(b), g);
      g += cat.block(b).numel();
    }
    t1 = now(), p.pack = t1 - t, t = t1;
    push(s, blocks, packed.data());
    t1 = now(), p.push = t1 - t, t = t1;
    if (!std::isfinite(loss)) {
      std::printf("FAIL model=%s: loss %g at step %d is not finite\n", mc.name, loss, s);
      std::exit(1);
    }
    if (s == 1) res.loss_first = loss;
    res.loss_last = loss;
    if (timed) timed_steps.push_back(p);
  }
  record_profile(false);
  if (profile) {
    // The push phase's two parts, timed alone over all parameters as one block: the global
    // norm's sum of squares and the AdamW update (both in optim/, outside the kernels).
    pdtrain::BlockState st;
    st.param.assign(packed.size(), 0.01f), st.m.assign(packed.size(), 0.0f);
    st.v.assign(packed.size(), 0.0f), st.decay = true;
    pdtrain::adamw_update(opt, 1, 1e-4, 1.0f, packed.data(), st);  // warm the pages
    double t = now();
    volatile double sumsq = pdtrain::sum_of_squares(packed.data(), std::int64_t(packed.size()));
    const double t_norm = now() - t;
    t = now();
    pdtrain::adamw_update(opt, 2, 1e-4, 1.0f, packed.data(), st);
    const double t_adamw = now() - t;
    res.opt_params = double(packed.size());
    res.opt_sumsq_s = t_norm;
    (void)sumsq;
    res.opt_adamw_s = t_adamw;
  }
  // Medians over the timed steps (robust against a step that shares the machine with
  // something else): of the whole step, of forward+backward, and of each phase.
  auto median = [&](auto field) {
    std::vector<double> v;
    for (const Phases& p : timed_steps) v.push_back(field(p));
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  res.step_s = median([](const Phases& p) { return p.total(); });
  res.fwdbwd_s = median([](const Phases& p) { return p.forward + p.backward; });
  res.min_step_s = 1e30;
  for (const Phases& p : timed_steps) res.min_step_s = std::min(res.min_step_s, p.total());
  res.phases.fetch = median([](const Phases& p) { return p.fetch; });
  res.phases.zero = median([](const Phases& p) { return p.zero; });
  res.phases.forward = median([](const Phases& p) { return p.forward; });
  res.phases.backward = median([](const Phases& p) { return p.backward; });
  res.phases.pack = median([](const Phases& p) { return p.pack; });
  res.phases.push = median([](const Phases& p) { return p.push; });
  return res;
}

void print_profile(int steps) {
  const auto totals = g_profile->take();
  std::vector<std::pair<std::string, std::pair<double, long>>> rows;
  for (const auto& [name, e] : totals) rows.push_back({name, {e.seconds, e.calls}});
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.first;
  std::printf("  profile (ms per step, calls per step; GEMMs as op MxNxK):\n");
  for (const auto& r : rows)
    std::printf("    %9.2f ms %6.1f %%  %6ld  %s\n", 1e3 * r.second.first / steps,
                100.0 * r.second.first / sum, r.second.second / steps, r.first.c_str());
  std::printf("    %9.2f ms total in kernels and GEMMs\n", 1e3 * sum / steps);
}

// The 1/5/15-minute load averages (Linux), to tell a quiet run from one that shared the CPUs.
std::string loadavg() {
  std::FILE* f = std::fopen("/proc/loadavg", "r");
  if (f == nullptr) return "n/a";
  char buf[128] = {};
  const bool ok = std::fgets(buf, sizeof buf, f) != nullptr;
  std::fclose(f);
  std::string s = ok ? buf : "n/a";
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-12 * std::abs(b); }

}  // namespace

int main(int argc, char** argv) {
  bool short_mode = false, profile = false;
  std::string which = "all";
  int steps = 5, warmup = 2, threads = 2, lanes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--short") short_mode = true;
    else if (a == "--profile") profile = true;
    else if (a == "--model") which = next();
    else if (a == "--steps") steps = std::max(1, std::atoi(next()));
    else if (a == "--warmup") warmup = std::max(0, std::atoi(next()));
    else if (a == "--threads") threads = std::max(1, std::atoi(next()));
    else if (a == "--lanes") lanes = std::atoi(next());
    else {
      std::fprintf(stderr,
                   "usage: bench_single_rank [--short] [--model 124M|small|all] [--steps N] "
                   "[--warmup N] [--threads N] [--lanes 4|8] [--profile]\n");
      return 2;
    }
  }
  int kokkos_argc = 1;  // our options are not Kokkos' (it would reject --threads)
  Kokkos::ScopeGuard kokkos(kokkos_argc, argv);
  std::unique_ptr<pdtrain::kernels::KernelProfile> profiler;
  if (profile) profiler = std::make_unique<pdtrain::kernels::KernelProfile>();
  g_profile = profiler.get();
  pdtrain::kernels::set_blas_threads(threads);

  const ModelCase gpt2{"124M", 12, 768, 12, 50257, 4, 64};
  const ModelCase small{"small", 6, 384, 6, 256, 4, 64};
  const ModelCase tiny{"tiny", 2, 64, 4, 256, 2, 16};

  int failures = 0;
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) {
      std::printf("FAIL %s\n", what.c_str());
      ++failures;
    }
  };
  // The FLOP formula against numbers worked out by hand (python: 6*B*T*(12*L*C*C + V*C) and
  // 6*L*B*T*T*C), and its parameter count against the catalogue's tensors.
  check(near(model_flops(gpt2), 189745201152.0 + 905969664.0), "124M model FLOPs");
  check(near(model_flops(small), 16458448896.0 + 226492416.0), "small model FLOPs");
  check(near(model_flops(tiny), 22020096.0 + 393216.0), "tiny model FLOPs");
  for (const ModelCase* m : {&gpt2, &small, &tiny}) {
    pdtrain::ModelConfig cfg;
    cfg.n_layer = m->n_layer, cfg.n_head = m->n_head, cfg.d_model = m->d_model;
    cfg.vocab_size = m->vocab, cfg.seq_len = m->seq_len;
    const ParamCatalog cat(pdtrain::resolve_model_shape(cfg));
    check(catalog_matmul_params(cat) == matmul_params(*m),
          std::string("matmul parameter count of ") + m->name + " against the catalogue");
  }

  int simd_lanes = 1;  // lanes of the float exp/GELU spans (1: scalar build)
#ifdef PDTRAIN_KERNELS_VECTOR_SPANS
  simd_lanes = pdtrain::kernels::detail::set_vector_lanes(lanes);
#endif

  const std::string core = pdtrain::kernels::blas_corename();
  std::printf("bench_single_rank: BLAS core '%s', %d BLAS thread(s), Kokkos %s, %d-lane float "
              "exp/GELU\n",
              core.c_str(), threads, Kokkos::DefaultExecutionSpace::name(), simd_lanes);
  std::printf("load average at start: %s\n", loadavg().c_str());
  // The ceiling is measured before the first model and again after each one; the ratio lines
  // use the highest (so a busy moment during a ceiling run cannot flatter the fraction).
  const int n_ceiling = short_mode ? 256 : 2048, reps = short_mode ? 2 : 5;
  double ceiling = sgemm_gflops(n_ceiling, reps);
  std::printf("ceiling: SGEMM %d^3 best of %d: %.1f GFLOP/s\n", n_ceiling, reps, ceiling);

  std::vector<ModelCase> cases;
  if (short_mode) cases = {tiny}, warmup = 1, steps = 1;
  else if (which == "124M") cases = {gpt2};
  else if (which == "small") cases = {small};
  else cases = {gpt2, small};

  std::vector<Result> results;
  for (const ModelCase& m : cases) {
    const Result r = run_model(m, warmup, steps, profile);
    results.push_back(r);
    const double flops = model_flops(m);
    const Phases& p = r.phases;
    std::printf(
        "model %s: L=%lld C=%lld NH=%lld V=%lld B=%lld T=%lld, %.4g GFLOP/step, %d warm-up + %d "
        "timed steps, loss %.4f -> %.4f\n",
        m.name, (long long)m.n_layer, (long long)m.d_model, (long long)m.n_head,
        (long long)m.vocab, (long long)m.batch, (long long)m.seq_len, flops * 1e-9, warmup,
        steps, r.loss_first, r.loss_last);
    std::printf(
        "  step %.1f ms (median; min %.1f) = fetch %.1f + zero %.1f + forward %.1f + backward "
        "%.1f + pack %.1f + push/adamw %.1f (phase medians)\n",
        1e3 * r.step_s, 1e3 * r.min_step_s, 1e3 * p.fetch, 1e3 * p.zero, 1e3 * p.forward,
        1e3 * p.backward, 1e3 * p.pack, 1e3 * p.push);
    if (profile) {
      print_profile(steps);
      std::printf("  optimizer alone over %.0f params: sum_of_squares %.1f ms, adamw_update "
                  "%.1f ms\n",
                  r.opt_params, 1e3 * r.opt_sumsq_s, 1e3 * r.opt_adamw_s);
    }
    const double again = sgemm_gflops(n_ceiling, reps);
    std::printf("ceiling again: %.1f GFLOP/s\n", again);
    ceiling = std::max(ceiling, again);
  }
  std::printf("load average at end: %s\n", loadavg().c_str());

  for (std::size_t k = 0; k < cases.size(); ++k) {
    const ModelCase& m = cases[k];
    const Result& r = results[k];
    const double tokens = double(m.batch) * m.seq_len;
    const double flops = model_flops(m);
    const double gflops = flops / r.step_s * 1e-9;
    const double fraction = gflops / ceiling;
    std::printf("model %s forward+backward only: %.1f GFLOP/s, fraction %.3f\n", m.name,
                flops / r.fwdbwd_s * 1e-9, flops / r.fwdbwd_s * 1e-9 / ceiling);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "ratio model=%s gflops=%.2f ceiling=%.2f fraction=%.3f tokens_per_s=%.1f",
                  m.name, gflops, ceiling, fraction,
                  tokens / r.step_s);
    std::printf("%s\n", line);
    // The line must parse back to numbers that agree with each other.
    char name[32];
    double tps = 0, g = 0, c = 0, f = 0;
    const int got = std::sscanf(line + 5,
                                " model=%31s gflops=%lf ceiling=%lf fraction=%lf tokens_per_s=%lf",
                                name, &g, &c, &f, &tps);
    check(got == 5 && std::string(name) == m.name, "ratio line does not parse");
    // Agree up to the printed rounding: gflops and ceiling to 0.005, the fraction to 0.0005
    // (a loaded machine's 0.01 GFLOP/s is 50 % off in its last printed digit).
    const double rounding = 0.0005 + 0.005 * (1 + g / c) / c;
    check(std::abs(g / c - f) <= rounding + 1e-2 * f, "ratio line: gflops/ceiling != fraction");
    check(std::abs(tps * flops / tokens * 1e-9 - g) <= 1e-2 * g + 1e-2,
          "ratio line: tokens/s and gflops disagree");
    check(ceiling > 0 && gflops > 0, "non-positive throughput");
  }
  if (failures > 0) return 1;
  std::printf("bench_single_rank: ok\n");
  return 0;
}
