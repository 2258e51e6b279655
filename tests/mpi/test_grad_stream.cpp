// Gradients streamed out during backward (app/grad_stream): each unit reduced over the
// data-parallel replicas and pushed as soon as its gradient is final gives bitwise the
// segments of the whole-stage reduction, and the rank's own accounting of the gradient memory
// it held stays within the bound, which is far below the stage's gradients with one
// micro-batch, or with several in layer-major order; the parameters meanwhile stay within the
// cache's bound (a cache of two layers). Runs under mpiexec with 2 ranks: two
// data-parallel replicas (reduced, then pushed), or each rank its own (pushed).
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>
#include <vector>

#include "pdtrain/app/grad_stream.hpp"
#include "pdtrain/app/stage_cache.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/model/gpt_stage.hpp"
#include "pdtrain/schedule/grad_reduce.hpp"
#include "run_helpers.hpp"
#include "../support/separate_host_device.hpp"

namespace pdtrain::test {
namespace {

ModelShape shape() {
  return resolve_model_shape(
      {.n_layer = 4, .n_head = 2, .d_model = 16, .vocab_size = 40, .seq_len = 8});
}

std::vector<float> initial(const ParamCatalog& cat, int id) {
  const BlockInfo& b = cat.block(id);
  std::vector<float> v(static_cast<std::size_t>(b.numel()));
  cat.init_block(b, 0.3, 5, v.data());
  return v;
}

// Serves the initial parameters and records every push, block by block.
class RecordingService final : public ParameterService {
 public:
  explicit RecordingService(const ParamCatalog& cat) : cat_(cat) {}
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override {
    for (int b : blocks) sink(b, initial(cat_, b).data());
    return {version, 0, 0};
  }
  std::optional<UpdateInfo> update_info(std::int64_t) const override { return std::nullopt; }
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override {
    for (int b : blocks) {
      const std::int64_t n = cat_.block(b).numel();
      EXPECT_TRUE(pushed[b].empty()) << "block " << b << " pushed twice";
      pushed[b].assign(grads, grads + n);
      grads += n;
      steps.push_back(step);
    }
  }
  std::uint32_t finish_and_checksum() override { return 0; }
  std::int64_t bytes_fetched() const override { return 0; }
  std::int64_t bytes_pushed() const override { return 0; }

  std::map<int, std::vector<float>> pushed;
  std::vector<std::int64_t> steps;

 private:
  const ParamCatalog& cat_;
};

constexpr std::int64_t kMicroBatch = 2;

// This replica's tokens of micro-batch j (different on each replica).
void batch(const ModelShape& s, int j, std::vector<std::int32_t>& tokens,
           std::vector<std::int32_t>& targets) {
  tokens.clear();
  targets.clear();
  const std::uint64_t key = rng_key(11, static_cast<std::uint64_t>(world_rank() * 100 + j));
  for (std::int64_t i = 0; i < kMicroBatch * s.seq_len; ++i) {
    tokens.push_back(static_cast<std::int32_t>(rng_below(key, 2 * i, s.vocab_size)));
    targets.push_back(static_cast<std::int32_t>(rng_below(key, 2 * i + 1, s.vocab_size)));
  }
}

struct Case {
  int micro_batches;
  StageOrder order;
  bool replicas;  // the two ranks are two data-parallel replicas, else each its own
  bool staged = false;  // device memory apart from the host's: downloads before pushes
  int pushes_in_flight = 1;  // pd.pushes_in_flight
  MPI_Comm dp_comm() const { return replicas ? MPI_COMM_WORLD : MPI_COMM_SELF; }
};

int slots(const Case& c) { return c.order == StageOrder::layer ? c.micro_batches : 1; }

void train_micro_batches(GptStage& stage, const ModelShape& s, const Case& c) {
  std::vector<std::int32_t> tokens, targets;
  for (int j = 0; j < c.micro_batches; ++j) {
    batch(s, j, tokens, targets);
    if (c.order == StageOrder::layer) {
      stage.load(j, tokens.data(), targets.data());
      continue;
    }
    stage.forward(0, tokens.data(), nullptr, targets.data());
    stage.backward(0, 0.01f, nullptr);
  }
  if (c.order == StageOrder::layer) {
    stage.forward_layer_major(c.micro_batches);
    stage.backward_layer_major(c.micro_batches, 0.01f);
  }
  (void)stage.take_loss_sum();
}

// The whole-stage way: resident gradients, reduced at once; this replica's segment by block.
std::map<int, std::vector<float>> whole_stage_segment(const ParamCatalog& cat, const Case& c) {
  const ModelShape s = cat.shape();
  StageParams params(cat, StageSpec{0, s.n_layer, true, true, 1, 0});
  for (int id : params.needed_blocks()) params.unpack_param(cat.block(id), initial(cat, id).data());
  params.upload_params();
  NoTensorParallel tp;
  GptStage stage(params, kMicroBatch, s.seq_len, tp, slots(c), Recompute::none,
                 kernels::cpu_kernel_ops(), c.order);
  params.zero_grads();
  train_micro_batches(stage, s, c);
  params.download_grads();
  std::vector<std::int64_t> numel;
  std::vector<float> packed;
  for (int b : params.needed_blocks()) {
    numel.push_back(cat.block(b).numel());
    std::vector<float> g(static_cast<std::size_t>(numel.back()));
    params.pack_grad(cat.block(b), g.data());
    packed.insert(packed.end(), g.begin(), g.end());
  }
  GradReducer reducer(c.dp_comm(), params.needed_blocks(), numel);
  const float* mine = reducer.reduce_scatter(packed.data());
  std::map<int, std::vector<float>> out;
  for (int b : reducer.my_blocks()) {
    out[b].assign(mine, mine + cat.block(b).numel());
    mine += cat.block(b).numel();
  }
  return out;
}

struct Streamed {
  std::map<int, std::vector<float>> pushed;  // every block this replica pushed
  std::int64_t peak = 0, bound = 0, stage_grad_bytes = 0;
  std::int64_t cache_peak = 0, cache_capacity = 0;  // the parameters' side, same rank
};

Streamed streamed(const ParamCatalog& cat, const Case& c, int steps) {
  const bool layer_major = c.order == StageOrder::layer;
  const ModelShape s = cat.shape();
  SeparateHostDevice separate;
  Device& device = c.staged ? static_cast<Device&>(separate) : cpu_device();
  StageParams params(cat, StageSpec{0, s.n_layer, true, true, 1, 0},
                     StageParams::Storage::streamed, Precision::fp32, device);
  RecordingService service(cat);
  // Parameters through a cache of two layers: evictions and re-fetches within each step.
  const std::int64_t capacity = 2 * 4 * params.unit_storage(0);
  StageCache cache(params, service, capacity, 2, nullptr);
  GradStreamer grads(params, service, kernels::cpu_kernel_ops(), c.dp_comm(), nullptr,
                     layer_major ? 1 : c.micro_batches, c.pushes_in_flight, nullptr);
  NoTensorParallel tp;
  GptStage stage(params, kMicroBatch, s.seq_len, tp, slots(c), Recompute::none,
                 kernels::cpu_kernel_ops(), c.order);
  Streamed out;
  for (int step = 1; step <= steps; ++step) {
    service.pushed.clear();
    cache.begin(0, layer_major ? StageCache::layer_major_plan(params)
                               : StageCache::step_plan(params, PipelineKind::one_f_one_b, 1, 0,
                                                       c.micro_batches));
    grads.begin_step(step);
    train_micro_batches(stage, s, c);
    grads.end_step();
    cache.end();
    for (std::int64_t st : service.steps) EXPECT_EQ(st, step);
    service.steps.clear();
  }
  out.pushed = service.pushed;
  out.peak = grads.peak_bytes();
  out.cache_peak = cache.stats().peak_bytes;
  out.cache_capacity = capacity;
  out.bound = grads.bound();
  out.stage_grad_bytes = 4 * params.numel();
  return out;
}

class GradStream : public ::testing::TestWithParam<Case> {};

TEST_P(GradStream, PushesTheWholeStageReductionBitwiseWithinTheMemoryBound) {
  ASSERT_EQ(world_size(), 2);
  const Case c = GetParam();
  const ParamCatalog cat(shape());
  const auto expected = whole_stage_segment(cat, c);
  const Streamed got = streamed(cat, c, 2);  // the second step reuses the pools
  // Each unit is split over the replicas on its own, so a replica pushes other blocks than the
  // whole-stage split gives it; together the replicas push every block once.
  int pushed = static_cast<int>(got.pushed.size()), total = 0;
  MPI_Allreduce(&pushed, &total, 1, MPI_INT, MPI_SUM, c.dp_comm());
  EXPECT_EQ(total, static_cast<int>(cat.blocks().size()));
  // Compare on rank 0: gather every replica's pushed blocks there, and the expected ones.
  auto gather = [&](const std::map<int, std::vector<float>>& mine) {
    if (!c.replicas) return mine;  // each rank pushed the whole stage
    std::vector<float> flat;
    for (const auto& [b, v] : mine) {
      flat.push_back(static_cast<float>(b));
      flat.push_back(static_cast<float>(v.size()));
      flat.insert(flat.end(), v.begin(), v.end());
    }
    int n = static_cast<int>(flat.size()), other = 0;
    std::map<int, std::vector<float>> all = mine;
    if (world_rank() == 1) MPI_Send(&n, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
    if (world_rank() == 1) MPI_Send(flat.data(), n, MPI_FLOAT, 0, 8, MPI_COMM_WORLD);
    if (world_rank() == 0) {
      MPI_Recv(&other, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      std::vector<float> in(static_cast<std::size_t>(other));
      MPI_Recv(in.data(), other, MPI_FLOAT, 1, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      for (std::size_t i = 0; i < in.size();) {
        const int b = static_cast<int>(in[i]);
        const auto len = static_cast<std::size_t>(in[i + 1]);
        all[b].assign(in.begin() + static_cast<std::ptrdiff_t>(i + 2),
                      in.begin() + static_cast<std::ptrdiff_t>(i + 2 + len));
        i += 2 + len;
      }
    }
    return all;
  };
  const auto want = gather(expected), have = gather(got.pushed);
  if (world_rank() == 0 || !c.replicas) {
    ASSERT_EQ(have.size(), want.size());
    for (const auto& [b, v] : want) {
      ASSERT_TRUE(have.count(b)) << cat.block_name(cat.block(b));
      EXPECT_EQ(have.at(b), v) << cat.block_name(cat.block(b));
    }
  }
  EXPECT_GT(got.peak, 0);
  EXPECT_LE(got.peak, got.bound);
  // Resident parameters and gradients together stay within the two bounds.
  EXPECT_GT(got.cache_peak, 0);
  EXPECT_LE(got.cache_peak, got.cache_capacity);
  EXPECT_LE(got.cache_peak + got.peak, got.cache_capacity + got.bound);
  // The bound, unit by unit: with one micro-batch the tied embedding (from the head's backward
  // to the lookup's), the small units, the layer being done and the previous one on the wire
  // (also with several in layer-major order); with several micro-batch by micro-batch, every
  // unit from the first backward to the last, and the packed layer. Staged, a
  // unit waits for its download until the next one is final: one layer more. With no push in
  // flight (pd.pushes_in_flight = 0) and one replica (pushed from its gradient memory), the
  // layer on the wire is not held: one layer less. (Replicas pack a layer for the reduction, and
  // the packed buffer stays in the pool: the same bound as with one in flight.)
  const int on_wire = c.pushes_in_flight == 0 && !c.replicas ? 0 : 1;
  const StageParams shapes(cat, StageSpec{0, 4, true, true, 1, 0},
                           StageParams::Storage::shapes_only);
  const std::int64_t layer = shapes.unit_numel(0);
  const std::int64_t small = shapes.unit_numel(shapes.wte_unit()) +
                             shapes.unit_numel(shapes.wpe_unit()) +
                             shapes.unit_numel(shapes.lnf_unit());
  if (c.micro_batches == 1 || c.order == StageOrder::layer) {
    EXPECT_EQ(got.bound, 4 * (small + (c.staged ? 2 : 1) * layer + on_wire * layer));
    EXPECT_LT(got.bound, got.stage_grad_bytes * (c.staged ? 8 : 6) / 10);
  } else {
    EXPECT_EQ(got.bound, got.stage_grad_bytes + 4 * on_wire * layer);
  }
}

INSTANTIATE_TEST_SUITE_P(MicroBatches, GradStream,
                         ::testing::Values(Case{1, StageOrder::micro_batch, true},
                                           Case{3, StageOrder::micro_batch, true},
                                           Case{3, StageOrder::layer, true},
                                           Case{1, StageOrder::micro_batch, false},
                                           Case{3, StageOrder::micro_batch, false},
                                           Case{3, StageOrder::layer, false},
                                           Case{1, StageOrder::micro_batch, false, true},
                                           Case{3, StageOrder::micro_batch, true, true},
                                           Case{3, StageOrder::layer, true, true},
                                           Case{1, StageOrder::micro_batch, false, false, 0},
                                           Case{3, StageOrder::micro_batch, false, false, 0},
                                           Case{3, StageOrder::layer, false, false, 0},
                                           Case{1, StageOrder::micro_batch, false, true, 0},
                                           Case{1, StageOrder::micro_batch, true, false, 0}));

}  // namespace
}  // namespace pdtrain::test
