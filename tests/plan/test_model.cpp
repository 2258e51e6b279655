// The performance model's arithmetic: parameter counts against the catalogue, activations from
// the stage's own allocation plan, and the directions every term must move in.
#include <gtest/gtest.h>

#include "pdtrain/app/report.hpp"
#include "pdtrain/model/catalog.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/model/stage_params.hpp"
#include "pdtrain/plan/machine.hpp"
#include "pdtrain/plan/model.hpp"

namespace pdtrain::plan {
namespace {

Machine machine(const char* file) { return load_machine(std::string(PDTRAIN_SOURCE_DIR "/machines/") + file); }

Deck deck_with(const std::vector<std::string>& sets) { return parse_deck("", "t.toml", sets); }

// The deck's input as `pdtrain plan` builds it: PD gradients from GradStreamer's bound.
PlanInput input(const std::vector<std::string>& sets, LayoutShape shape, int nodes = 1) {
  const Deck deck = deck_with(sets);
  PlanInput in = plan_input(deck, shape, nodes);
  if (shape.holders > 0) in.pd_grad_bytes = pd_grad_bound(deck, shape);
  return in;
}

const std::vector<std::string> k124M = {"model.n_layer=12", "model.n_head=12", "model.d_model=768",
                                        "model.vocab_size=50257", "model.seq_len=1024",
                                        "train.batch_size=64"};

TEST(PlanModel, StageParametersAddUpToTheCatalogue) {
  for (int pp : {1, 2, 3}) {
    const PlanInput in = input({"model.n_layer=6", "model.n_head=4", "model.d_model=64"}, {1, 1, 1, pp});
    const Prediction p = predict(in, machine("h100-sxm.toml"));
    double sum = 0;
    for (const StagePrediction& s : p.stages) sum += s.param_count;
    const ParamCatalog cat(in.model);
    // The tied embedding is counted on both end stages when there are two or more.
    const double tied = pp > 1 ? static_cast<double>(in.model.padded_vocab * in.model.d_model) : 0;
    EXPECT_DOUBLE_EQ(sum - tied, static_cast<double>(cat.total_numel())) << "pp " << pp;
    EXPECT_DOUBLE_EQ(p.holder.param_count, static_cast<double>(cat.total_numel()));
  }
}

TEST(PlanModel, EachRanksParametersAreTheBlocksItFetches) {
  for (int tp : {1, 2, 4})
    for (int pp : {1, 3}) {
      const PlanInput in = input({"model.n_layer=6", "model.n_head=4", "model.d_model=64"}, {1, 1, tp, pp});
      const ParamCatalog cat(in.model);
      for (int p = 0; p < pp; ++p)
        for (int t = 0; t < tp; ++t) {
          const StageParams shapes(cat, split_stage(in.model.n_layer, pp, p, tp, t), StageParams::Storage::shapes_only,
                                   Precision::fp32);
          double bytes = 0;
          for (int b : shapes.needed_blocks()) bytes += static_cast<double>(cat.block(b).bytes());
          EXPECT_DOUBLE_EQ(compute_memory(in, p, t, false).params, bytes)
              << "tp " << tp << " pp " << pp << " stage " << p << " tp rank " << t;
        }
    }
}

TEST(PlanModel, ActivationsAreTheStagesOwnAllocationPlan) {
  const PlanInput in = input(k124M, {1, 2, 1, 1});
  const Prediction p = predict(in, machine("a100-80gb.toml"));
  const StageSpec whole{0, 12, true, true, 1, 0};
  // A GPU machine: the CUDA backend's attention buffers (the fused kernels' per-row floats)
  // and logits rows (padded to a multiple of 64).
  EXPECT_DOUBLE_EQ(p.stages[0].memory.activations,
                   static_cast<double>(GptStage::memory_bytes(
                       in.model, whole, 32, 1024, 1, Recompute::none, Precision::fp32,
                       StageOrder::micro_batch, kernels::cuda_attention_footprint(),
                       kernels::kGpuActivations)));
  EXPECT_LT(p.stages[0].memory.activations,
            static_cast<double>(GptStage::memory_bytes(in.model, whole, 32, 1024, 1)));
  // Full recomputation keeps less.
  const Prediction r = predict(input([] { auto s = k124M; s.push_back("train.recompute=\"full\""); return s; }(),
                                     {1, 2, 1, 1}),
                               machine("a100-80gb.toml"));
  EXPECT_LT(r.stages[0].memory.activations, p.stages[0].memory.activations);
  EXPECT_GT(r.step.compute, p.step.compute);  // and recomputes a forward
}

TEST(PlanModel, ModelFlopsAreTheBenchmarksFormula) {
  // perf/RESULTS.md: 124M at B 4 x T 64 is 190.65 GFLOP per step.
  ModelShape m{12, 12, 768, 50257, 50304, 64, 64};
  EXPECT_NEAR(model_flops(m, 4) / 1e9, 190.65, 0.01);
}

TEST(PlanModel, PipelineBubbleShrinksWithMicroBatches) {
  const Machine h100 = machine("h100-sxm.toml");
  auto with_m = [&](int m) {
    auto s = k124M;
    s.push_back("parallel.micro_batches=" + std::to_string(m));
    return predict(input(s, {1, 1, 1, 4}), h100);
  };
  const Prediction two = with_m(2), sixteen = with_m(16);
  // Filling and draining cost about (pp - 1) / m of the compute: 3/2 against 3/16 for equal
  // stages (less here: the end stages, with embedding and head, are the slowest).
  EXPECT_GT(two.step.bubble / two.step.compute, 0.5);
  EXPECT_LT(sixteen.step.bubble / sixteen.step.compute, 0.2);
  EXPECT_GT(sixteen.tokens_per_s, two.tokens_per_s);
}

TEST(PlanModel, TensorParallelismCostsAllReducesAndSplitsCompute) {
  const Machine a100 = machine("a100-80gb.toml");
  const Prediction one = predict(input(k124M, {1, 1, 1, 1}), a100);
  const Prediction four = predict(input(k124M, {1, 1, 4, 1}), a100);
  EXPECT_EQ(one.step.tp_comm, 0);
  EXPECT_GT(four.step.tp_comm, 0);
  EXPECT_LT(four.stages[0].param_count, one.stages[0].param_count / 3);
  EXPECT_LT(four.step.compute, one.step.compute);
}

TEST(PlanModel, StalenessHidesTheHolderUpdate) {
  const Machine a100 = machine("a100-80gb.toml");
  auto s0 = k124M, s1 = k124M;
  s1.push_back("pd.staleness=1");
  const Prediction p0 = predict(input(s0, {1, 8, 1, 1}), a100);
  const Prediction p1 = predict(input(s1, {1, 8, 1, 1}), a100);
  EXPECT_GT(p0.step.update, 0);
  EXPECT_EQ(p0.step.update, p1.step.update);
  EXPECT_LT(p1.step.update_exposed, p0.step.update_exposed);
  EXPECT_LE(p1.step.total, p0.step.total);
}

TEST(PlanModel, BoundedCacheFetchesPerUseAndHoldsLess) {
  const Machine a100 = machine("a100-80gb.toml");
  auto bounded = k124M;
  bounded.insert(bounded.end(), {"parallel.micro_batches=4", "pd.cache_mb=100"});
  auto whole = k124M;
  whole.push_back("parallel.micro_batches=4");
  const Prediction b = predict(input(bounded, {1, 1, 1, 1}), a100);
  const Prediction w = predict(input(whole, {1, 1, 1, 1}), a100);
  EXPECT_DOUBLE_EQ(b.stages[0].memory.params, 100 * 1048576.0);
  EXPECT_NEAR(b.step.fetch / w.step.fetch, 8.0, 0.5);  // 2 x 4 micro-batches against once
}

// Parameters, two moments and a gradient; plus the served versions' copies: at staleness 0 raw
// blocks are sent from the parameters themselves by message, but published into the shared
// segment (pd.fetch_path = auto) they are copied.
TEST(PlanModel, HolderMemoryIsSixteenBytesPerParameterAtStalenessZero) {
  auto by_message = k124M;
  by_message.push_back("pd.fetch_path=mpi");
  const Prediction p = predict(input(by_message, {4, 1, 1, 1}), machine("h200.toml"));
  EXPECT_DOUBLE_EQ(p.holder.memory, 16 * p.holder.param_count);
  const Prediction shared = predict(input(k124M, {4, 1, 1, 1}), machine("h200.toml"));
  EXPECT_DOUBLE_EQ(shared.holder.memory, (16 + 4) * shared.holder.param_count);
  auto stale = k124M;
  stale.push_back("pd.staleness=2");
  const Prediction s = predict(input(stale, {4, 1, 1, 1}), machine("h200.toml"));
  EXPECT_DOUBLE_EQ(s.holder.memory, (16 + 3 * 4) * s.holder.param_count);  // 3 served versions
}

TEST(PlanModel, ALayoutThatDoesNotFitNamesTheRankAndWhatOverflows) {
  // GPT-3 175B-like on one stage of an 80 GiB GPU, replicated: parameters overflow.
  auto big = std::vector<std::string>{"model.n_layer=96", "model.n_head=96", "model.d_model=12288",
                                      "model.vocab_size=50257", "model.seq_len=2048",
                                      "train.batch_size=8", "parallel.holders=0"};
  const Prediction p = predict(input(big, {0, 8, 1, 1}), machine("a100-80gb.toml"));
  ASSERT_FALSE(p.fits());
  EXPECT_EQ(p.overflows[0].who, "compute rank 0 (stage 0, tp 0, and its tp peers)");
  EXPECT_NE(p.overflows[0].what.find("the largest part is its optimizer state"), std::string::npos)
      << p.overflows[0].what;
  // The same model over 8 x 8 stages with holders overflows by its activations (8 in flight
  // on stage 0 under 1F1B) and fits with full recomputation.
  big.back() = "parallel.holders=64";
  big.push_back("parallel.micro_batches=8");
  const Prediction a = predict(input(big, {64, 1, 8, 8}, 8), machine("a100-80gb.toml"));
  ASSERT_FALSE(a.fits());
  EXPECT_NE(a.overflows[0].what.find("the largest part is its activations"), std::string::npos);
  big.push_back("train.recompute=\"full\"");
  const Prediction q = predict(input(big, {64, 1, 8, 8}, 8), machine("a100-80gb.toml"));
  for (const Overflow& o : q.overflows) ADD_FAILURE() << o.who << ": " << o.what;
}

TEST(PlanModel, CpuRanksRunOnTheirThreadsAndShareCoresOnlyBeyondThem) {
  // 2 cores (machines/cpu-local.toml): one BLAS thread per rank; a compute rank has a core of its
  // own whether a holder is beside it or not (holders mostly wait), so a stage's micro-batch
  // takes the same time with one or two compute ranks beside a holder.
  // Waits cost nothing here (PlanModel.WaitsTakeTheirShareOfTheCores has them).
  Machine cpu = machine("cpu-local.toml");
  cpu.node.wait_core_share = 0;
  const std::vector<std::string> small = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                          "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16"};
  auto with = [&](std::vector<std::string> extra, LayoutShape shape) {
    extra.insert(extra.begin(), small.begin(), small.end());
    return predict(input(extra, shape), cpu);
  };
  const Prediction one = with({"parallel.micro_batches=2"}, {1, 1, 1, 1});  // 8 sequences a pass
  const Prediction two = with({}, {1, 2, 1, 1});                            // 8 sequences a rank
  EXPECT_DOUBLE_EQ(one.stages[0].forward, two.stages[0].forward);
  // One compute rank leaves the holder a core; two fill both, and the replicas, meeting every
  // unit, wait for whichever one the holder displaces: its whole update (and more) shows.
  EXPECT_EQ(one.step.cores_shared, 0);
  EXPECT_GE(two.step.cores_shared, two.step.update);
  EXPECT_LT(two.step.cores_shared, 0.1 * two.step.total);
  // Four compute ranks on two cores (tp 2 x pp 2) wait for each other's time slices: the step is
  // at least their busy core-seconds over the cores.
  const Prediction four = with({"parallel.micro_batches=2"}, {1, 1, 2, 2});
  EXPECT_GT(four.step.cores_shared, 0);
  double busy = 0;
  for (const StagePrediction& st : four.stages)
    busy += 2 * 2 * (st.forward + st.backward - st.tp_comm - st.p2p);  // tp 2, m 2, one thread
  EXPECT_GE(four.step.compute + four.step.bubble + four.step.cores_shared, busy / 2 * 0.999);
  // A GPU node never shares: its ranks have their devices.
  EXPECT_EQ(predict(input(small, {1, 1, 2, 2}), machine("h100-sxm.toml")).step.cores_shared, 0);
}

// A rank that waits still takes node.wait_core_share of a core (its quiet wait's timer
// wake-ups). Beside one compute rank the holder has a core and its waits cost the step nothing;
// where compute ranks fill the cores, the holder displaces one of them for its work and its
// waits' share of the step; four compute ranks and a holder on 2 cores take their work and
// their waits' share of the step over the cores. A GPU node's ranks have their devices.
TEST(PlanModel, WaitsTakeTheirShareOfTheCores) {
  Machine cpu = machine("cpu-local.toml");
  const std::vector<std::string> small = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                          "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16",
                                          "parallel.micro_batches=2"};
  auto at = [&](double share, LayoutShape shape) {
    cpu.node.wait_core_share = share;
    return predict(input(small, shape), cpu);
  };
  constexpr double kShare = 0.1;
  EXPECT_EQ(at(kShare, {1, 1, 1, 1}).step.cores_shared, 0);

  const double holder_work = at(0, {1, 2, 1, 1}).step.cores_shared;  // the holder's work alone
  const Prediction two = at(kShare, {1, 2, 1, 1});
  EXPECT_GT(holder_work, 0);
  EXPECT_NEAR(two.step.cores_shared, holder_work + kShare * (two.step.total - holder_work),
              1e-9 * two.step.total);

  const Prediction four = at(kShare, {1, 1, 2, 2});
  EXPECT_GT(four.step.total, at(0, {1, 1, 2, 2}).step.total);
  double work = 0;  // the compute ranks' (the holder's comes on top)
  for (const StagePrediction& st : four.stages)
    work += 2 * 2 * (st.forward + st.backward - st.tp_comm - st.p2p);  // tp 2, m 2, one thread
  const double ranks = 5, cores = 2;
  EXPECT_GE(four.step.compute + four.step.bubble + four.step.cores_shared,
            (work + kShare * (ranks * four.step.total - work)) / cores * 0.999);

  Machine gpu = machine("h100-sxm.toml");
  gpu.node.wait_core_share = kShare;
  EXPECT_EQ(predict(input(small, {1, 1, 2, 2}), gpu).step.cores_shared, 0);
}

// The elementwise kernels run at device.elementwise_gbs over the bytes forward_elementwise_bytes
// counts (backward twice): halving the rate adds exactly those bytes' time again, and nothing
// else moves.
TEST(PlanModel, ElementwiseKernelsRunAtTheCalibratedRate) {
  Machine cpu = machine("cpu-local.toml");
  ASSERT_GT(cpu.device.elementwise_rate, 0) << "cpu-local.toml is written by --calibrate";
  const std::vector<std::string> sets = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                         "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16"};
  const PlanInput in = input(sets, {1, 1, 1, 1});
  const Prediction fast = predict(in, cpu);
  cpu.device.elementwise_rate /= 2;
  const Prediction slow = predict(in, cpu);
  const StageSpec spec = split_stage(4, 1, 0, 1, 0);
  const double bytes = forward_elementwise_bytes(in.model, spec, 16, ActivationTraffic{}).total();
  const double share = 0.5;  // one BLAS thread of the node's two cores
  const double extra = bytes / (2 * cpu.device.elementwise_rate * share);  // at the fast rate
  EXPECT_NEAR(slow.stages[0].forward - fast.stages[0].forward, extra, 1e-9);
  EXPECT_NEAR(slow.stages[0].backward - fast.stages[0].backward, 2 * extra, 1e-9);
}

// Tensor parallelism splits GELU's columns but not the LayerNorms and residual adds: every tp
// rank runs those over the whole replicated residual stream (GptStage allocates them N x C).
TEST(PlanModel, TensorParallelRanksEachRunTheLayerNormsAndResidualsWhole) {
  const std::vector<std::string> sets = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                         "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16"};
  const PlanInput in = input(sets, {1, 1, 1, 1});
  const double N = 16 * 64, C = 256, layers = 4;
  const double whole = forward_elementwise_bytes(in.model, split_stage(4, 1, 0, 1, 0), 16, ActivationTraffic{}).layers;
  const double half = forward_elementwise_bytes(in.model, split_stage(4, 1, 0, 2, 0), 16, ActivationTraffic{}).layers;
  EXPECT_DOUBLE_EQ(whole, layers * 4 * N * 18 * C);
  EXPECT_DOUBLE_EQ(half, layers * 4 * N * (10 * C + 8 * C / 2));
}

// A GPU's bf16 run moves LayerNorm outputs and GELU activations as bf16 and runs GELU in the
// GEMM's epilogue (only its input is written beside the output); the residual stream is fp32.
TEST(PlanModel, AGpusBf16ActivationsMoveFewerBytes) {
  const std::vector<std::string> sets = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                         "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16"};
  const PlanInput in = input(sets, {1, 1, 1, 1});
  const double N = 16 * 64, C = 256, layers = 4;
  const StageSpec whole = split_stage(4, 1, 0, 1, 0);
  const auto bytes = [&](bool gpu, Precision p) {
    return forward_elementwise_bytes(in.model, whole, 16, pdtrain_traffic(gpu, p)).layers;
  };
  EXPECT_DOUBLE_EQ(bytes(false, Precision::bf16), layers * 4 * N * 18 * C);  // the CPU: fp32
  // LayerNorms 2 x (4 + 2), residual adds 5 x 4 (LayerNorm 2 reads its input in the residual
  // add's pass), GELU's input written 4 x 2 of 4C.
  EXPECT_DOUBLE_EQ(bytes(true, Precision::bf16), layers * N * (12 + 20 + 8) * C);
  EXPECT_DOUBLE_EQ(bytes(true, Precision::fp32), layers * N * (16 + 20 + 16) * C);
  // The logits: fp32 written and read twice; bf16 (the fused classifier) written and read once.
  const double V = static_cast<double>(in.model.padded_vocab);
  const auto head = [&](bool gpu, Precision p) {
    return forward_elementwise_bytes(in.model, whole, 16, pdtrain_traffic(gpu, p)).head;
  };
  EXPECT_DOUBLE_EQ(head(false, Precision::bf16), 3 * 4 * N * V);
  EXPECT_DOUBLE_EQ(head(true, Precision::fp32), 3 * 4 * N * V);
  EXPECT_DOUBLE_EQ(head(true, Precision::bf16), 2 * 2 * N * V);
}

// On a CPU node the compute rank's own core receives its fetches (shared-memory MPI: the
// receiver copies) and checks them: without pd.fetch_thread none of it hides behind compute,
// and it follows the update front instead of overlapping it. With the thread (or on a GPU
// node) prefetch hides it but the first unit.
TEST(PlanModel, ACpuRanksFetchIsItsOwnCoresWorkUnlessAThreadReceives) {
  const Machine cpu = machine("cpu-local.toml");
  const std::vector<std::string> sets = {"model.n_layer=4", "model.n_head=4", "model.d_model=256",
                                         "model.vocab_size=256", "model.seq_len=64", "train.batch_size=16"};
  std::vector<std::string> threaded = sets;
  threaded.push_back("pd.fetch_thread=true");
  const Prediction own = predict(input(sets, {1, 1, 1, 1}), cpu);
  const Prediction thread = predict(input(threaded, {1, 1, 1, 1}), cpu);
  EXPECT_DOUBLE_EQ(own.step.fetch_exposed, own.step.fetch);
  EXPECT_LT(thread.step.fetch_exposed, 0.5 * thread.step.fetch);
  EXPECT_NEAR(own.step.total - own.step.compute - own.step.cores_shared - own.step.dp_reduce,
              own.step.fetch_exposed + own.step.update_exposed + own.step.push_exposed, 1e-12);
  EXPECT_GT(own.step.total, thread.step.total);
}

TEST(PlanModel, TheCpuBaselinesOptimizerIsAtLeastItsAdamWArithmetic) {
  const Machine cpu = machine("cpu-local.toml");
  const Prediction p = predict(input({"model.n_layer=4", "model.d_model=256", "parallel.holders=0"}, {0, 2, 1, 1}), cpu);
  EXPECT_GE(p.step.update, p.stages[0].param_count / cpu.holder.adamw_params_per_core);
}

// GPT-2 124M at llm.c's micro-batch, B 16 x T 1024, and `more` settings.
std::vector<std::string> gpt2_124m_b16(std::vector<std::string> more) {
  std::vector<std::string> sets = {"model.n_layer=12", "model.n_head=12", "model.d_model=768",
                                   "model.vocab_size=50257", "model.seq_len=1024", "train.batch_size=16"};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// A GPU's fused attention is priced at its library's published rates on the device, never at
// the GEMM rate of the same FLOPs: GPT-2 124M, bf16, B 16 x T 1024 on an H200 takes cuDNN's
// SDPA (compute.attention = auto), whose causal forward at head size 64, T 1024 is 288
// TFLOP/s in FlashAttention's count; its backward (five T x T products against two) at the
// non-causal backward's 348 scaled as the forward is by the mask.
TEST(PlanModel, FusedAttentionIsPricedAtItsLibrarysPublishedRates) {
  const Machine h200 = machine("h200.toml");
  const std::vector<std::string> sets = gpt2_124m_b16({"train.precision=\"bf16\""});
  const double layers = 12, forward_flops = 4.0 * 16 * 12 * 1024 * 1024 * 64 / 2;
  const StagePrediction cudnn = predict(input(sets, {0, 1, 1, 1}), h200).stages[0];
  EXPECT_NEAR(cudnn.forward_kernels.attention, layers * forward_flops / 288e12, 1e-12);
  EXPECT_NEAR(cudnn.backward_kernels.attention, layers * 2.5 * forward_flops / (348e12 * 288 / 373), 1e-12);
  EXPECT_NE(cudnn.attention_kernels.find("cuDNN"), std::string::npos) << cudnn.attention_kernels;
  // pdtrain's own kernels are never priced faster than FlashAttention-2's published rates.
  const StagePrediction own =
      predict(input(gpt2_124m_b16({"train.precision=\"bf16\"", "compute.attention=\"pdtrain\""}), {0, 1, 1, 1}),
              h200).stages[0];
  EXPECT_NEAR(own.forward_kernels.attention, layers * forward_flops / 229e12, 1e-12);
  EXPECT_NEAR(own.backward_kernels.attention, layers * 2.5 * forward_flops / (238e12 * 229 / 306), 1e-12);
  // The old pricing (the machine's GEMM rate for the same FLOPs) was 2-3x faster than either.
  const double gemm_rate = h200.device.peak_bf16 * h200.device.gemm_efficiency(forward_flops);
  EXPECT_GT(cudnn.forward_kernels.attention, 1.5 * layers * forward_flops / gemm_rate);
  // A backward of five products costs more than twice the forward of two.
  EXPECT_GT(cudnn.backward_kernels.attention, 2.5 * cudnn.forward_kernels.attention);
}

// cuDNN's SDPA is 16-bit only: an fp32 run takes pdtrain's kernels, priced at the same share of
// the fp32 peak as FlashAttention-2 reaches of the bf16 one; heads wider than the fused
// kernels take run the products as GEMMs with the softmax in memory.
TEST(PlanModel, AttentionKernelsFollowPrecisionAndHeadSize) {
  const Machine h200 = machine("h200.toml");
  const std::vector<std::string> fp32 = gpt2_124m_b16({"train.precision=\"fp32\""});
  const std::vector<std::string> wide = gpt2_124m_b16({"train.precision=\"bf16\"", "model.n_head=6"});
  const StagePrediction f = predict(input(fp32, {0, 1, 1, 1}), h200).stages[0];
  EXPECT_NE(f.attention_kernels.find("pdtrain"), std::string::npos) << f.attention_kernels;
  const double forward_flops = 4.0 * 16 * 12 * 1024 * 1024 * 64 / 2;
  EXPECT_NEAR(f.forward_kernels.attention, 12 * forward_flops / (229e12 * 67 / 989.5), 1e-9);
  // cuDNN takes heads of 128; pdtrain's fused kernels do not.
  EXPECT_NE(predict(input(wide, {0, 1, 1, 1}), h200).stages[0].attention_kernels.find("cuDNN"), std::string::npos);
  std::vector<std::string> ours = wide;
  ours.push_back("compute.attention=\"pdtrain\"");
  EXPECT_NE(predict(input(ours, {0, 1, 1, 1}), h200).stages[0].attention_kernels.find("GEMMs"), std::string::npos);
}

// pdtrain's own kernels are priced at the slower of FlashAttention-2's published rates and the
// lower bound counted of them in the emulation (the machine file's "pdtrain" table): never
// faster than either.
TEST(PlanModel, PdtrainsKernelsAreNoFasterThanTheirCountedBound) {
  Machine h200 = machine("h200.toml");
  const std::vector<std::string> sets = gpt2_124m_b16({"train.precision=\"bf16\"", "compute.attention=\"pdtrain\""});
  const double layers = 12, forward_flops = 4.0 * 16 * 12 * 1024 * 1024 * 64 / 2;
  const AttentionRates* counted = h200.device.attention_rates("pdtrain");
  ASSERT_NE(counted, nullptr);
  const StagePrediction s = predict(input(sets, {0, 1, 1, 1}), h200).stages[0];
  EXPECT_GE(s.forward_kernels.attention, layers * forward_flops / counted->forward_causal_at(1024) * (1 - 1e-12));
  EXPECT_GE(s.backward_kernels.attention, layers * 2.5 * forward_flops / counted->backward_causal_at(1024) * (1 - 1e-12));
  // Where the count is the slower, it prices them.
  for (AttentionRates& r : h200.device.attention)
    if (r.library == "pdtrain") r.backward = {50e12}, r.forward = r.forward_causal = {100e12};
  const StagePrediction slow = predict(input(sets, {0, 1, 1, 1}), h200).stages[0];
  EXPECT_NEAR(slow.forward_kernels.attention, layers * forward_flops / 100e12, 1e-12);
  EXPECT_NEAR(slow.backward_kernels.attention, layers * 2.5 * forward_flops / 50e12, 1e-12);
  EXPECT_NE(slow.attention_kernels.find("counted lower bound"), std::string::npos) << slow.attention_kernels;
}

// A GPU bf16 layer's backward elementwise traffic is what its kernels were counted to move (118
// bytes per token and channel), not twice the forward's; a CPU's stays twice (--calibrate's).
TEST(PlanModel, BackwardElementwiseBytesAreTheKernelsCounted) {
  const PlanInput in = input(gpt2_124m_b16({"train.precision=\"bf16\""}), {0, 1, 1, 1});
  const StageSpec whole = split_stage(12, 1, 0, 1, 0);
  const ElementwiseBytes gpu = forward_elementwise_bytes(in.model, whole, 16, pdtrain_traffic(true, Precision::bf16));
  EXPECT_DOUBLE_EQ(gpu.layers_backward, 12.0 * 16 * 1024 * 768 * 118);
  EXPECT_GT(gpu.layers_backward, 2 * gpu.layers);
  const ElementwiseBytes cpu = forward_elementwise_bytes(in.model, whole, 16, pdtrain_traffic(false, Precision::bf16));
  EXPECT_DOUBLE_EQ(cpu.layers_backward, 2 * cpu.layers);
}

// The kinds of kernel add up to the stage's compute: forward and backward (no tensor or
// pipeline parallelism, so nothing else is in them).
TEST(PlanModel, KernelTimesAddUpToTheStagesCompute) {
  const Machine h200 = machine("h200.toml");
  const std::vector<std::string> sets = gpt2_124m_b16({"train.precision=\"bf16\""});
  const StagePrediction s = predict(input(sets, {0, 1, 1, 1}), h200).stages[0];
  EXPECT_NEAR(s.forward, s.forward_kernels.total(), 1e-12);
  EXPECT_NEAR(s.backward, s.backward_kernels.total(), 1e-12);
  EXPECT_GT(s.forward_kernels.classifier, 0);
  EXPECT_GT(s.forward_kernels.elementwise, 0);
}

}  // namespace
}  // namespace pdtrain::plan
