// The replicated baseline on a backend's device equals the holders' CPU arithmetic bit for bit:
// AdamW per block (holder_server.cpp's adamw_update) after the global norm of per-block sums of
// squares, added in block order. Written once, run per backend (backend_test_support.hpp).
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "backend_test_support.hpp"
#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/core/rng.hpp"
#include "pdtrain/pd/device_replica.hpp"

namespace pdtrain::kernels::testing {
namespace {

// Blocks of awkward sizes (around a sum-of-squares chunk, and tiny ones), decay flags in runs.
BlockTable table() {
  BlockTable t;
  const std::int64_t sizes[] = {4096 * 2 + 3, 7, 4096, 1, 300, 5000};
  const bool decay[] = {true, true, false, false, true, false};
  for (int b = 0; b < 6; ++b)
    t.blocks.push_back(BlockDesc{sizes[b], decay[b], "block" + std::to_string(b)});
  t.init = [](int id, float* out) {
    static const std::int64_t n[] = {4096 * 2 + 3, 7, 4096, 1, 300, 5000};
    for (std::int64_t i = 0; i < n[id]; ++i)
      out[i] = static_cast<float>(0.05 * rng_normal(rng_key(11, id), i));
  };
  t.canonical_crc = [](const std::vector<const float*>& data) {
    static const std::int64_t n[] = {4096 * 2 + 3, 7, 4096, 1, 300, 5000};
    std::uint32_t crc = 0;
    for (std::size_t b = 0; b < data.size(); ++b)
      crc ^= crc32c(data[b], static_cast<std::size_t>(n[b]) * sizeof(float));
    return crc;
  };
  return t;
}

class DeviceReplicaTest : public BackendTest {};

std::vector<float> gradients(std::int64_t n, int step) {
  std::vector<float> g(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) g[i] = static_cast<float>(rng_normal(rng_key(12, step), i));
  return g;
}

TEST_P(DeviceReplicaTest, StepsEqualTheHoldersArithmeticBitForBit) {
  const BlockTable t = table();
  AdamWConfig opt;
  opt.lr = 1e-2, opt.warmup_steps = 1, opt.total_steps = 4, opt.weight_decay = 0.1;
  opt.grad_clip = 1.0;  // the norms below are far above 1: clipping is exercised
  DeviceReplica replica(t, opt, device(), ops());
  std::vector<BlockState> reference(t.blocks.size());
  for (std::size_t b = 0; b < reference.size(); ++b) {
    reference[b].param.resize(static_cast<std::size_t>(t.blocks[b].numel));
    reference[b].m.assign(reference[b].param.size(), 0.0f);
    reference[b].v.assign(reference[b].param.size(), 0.0f);
    reference[b].decay = t.blocks[b].decay;
    t.init(static_cast<int>(b), reference[b].param.data());
  }
  std::vector<int> all;
  for (std::size_t b = 0; b < t.blocks.size(); ++b) all.push_back(static_cast<int>(b));
  for (int step = 1; step <= 3; ++step) {
    const std::vector<float> g = gradients(replica.numel(), step);
    replica.push(step, all, g.data());
    std::vector<double> sumsq;
    for (std::size_t b = 0; b < t.blocks.size(); ++b)
      sumsq.push_back(sum_of_squares(g.data() + replica.offset(static_cast<int>(b)),
                                     t.blocks[b].numel));
    const double norm = global_norm(sumsq);
    ASSERT_EQ(replica.update_info(step)->grad_norm, norm) << "step " << step;
    for (std::size_t b = 0; b < t.blocks.size(); ++b)
      adamw_update(opt, step, learning_rate(opt, step),
                   static_cast<float>(clip_factor(opt, norm)),
                   g.data() + replica.offset(static_cast<int>(b)), reference[b]);
  }
  const HolderHooks::OwnedBlocks got = replica.owned_blocks();
  for (std::size_t b = 0; b < reference.size(); ++b) {
    const BlockState& s = *got.at(static_cast<int>(b));
    EXPECT_EQ(std::memcmp(s.param.data(), reference[b].param.data(), s.param.size() * 4), 0) << b;
    EXPECT_EQ(std::memcmp(s.m.data(), reference[b].m.data(), s.m.size() * 4), 0) << b;
    EXPECT_EQ(std::memcmp(s.v.data(), reference[b].v.data(), s.v.size() * 4), 0) << b;
  }
}

TEST_P(DeviceReplicaTest, RestoreThenFetchGivesTheRestoredBlocks) {
  const BlockTable t = table();
  DeviceReplica replica(t, AdamWConfig{}, device(), ops());
  std::map<int, BlockState> state;
  for (std::size_t b = 0; b < t.blocks.size(); ++b) {
    BlockState s;
    const auto n = static_cast<std::size_t>(t.blocks[b].numel);
    for (std::size_t i = 0; i < n; ++i) {
      s.param.push_back(static_cast<float>(b) + 0.25f * static_cast<float>(i % 7));
      s.m.push_back(-static_cast<float>(i % 5));
      s.v.push_back(static_cast<float>(i % 3));
    }
    state[static_cast<int>(b)] = s;
  }
  const std::map<int, BlockState> expect = state;
  replica.restore(42, std::move(state));
  EXPECT_EQ(replica.version(), 42);
  std::vector<int> all;
  for (std::size_t b = 0; b < t.blocks.size(); ++b) all.push_back(static_cast<int>(b));
  int seen = 0;
  replica.fetch(42, all, [&](int id, const float* data) {
    ++seen;
    EXPECT_EQ(std::vector<float>(data, data + t.blocks[id].numel), expect.at(id).param) << id;
  });
  EXPECT_EQ(seen, 6);
  const HolderHooks::OwnedBlocks got = replica.owned_blocks();
  for (const auto& [id, s] : got) {
    EXPECT_EQ(s->m, expect.at(id).m) << id;
    EXPECT_EQ(s->v, expect.at(id).v) << id;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceReplicaTest, ::testing::ValuesIn(test_backends()),
                         backend_name);

}  // namespace
}  // namespace pdtrain::kernels::testing
