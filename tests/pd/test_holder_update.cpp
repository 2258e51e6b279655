// The holder's threaded arithmetic against the serial code it replaces: the fused update
// (AdamW + wire encoding + CRC per slice, on 1..3 threads) must give exactly the bits of
// adamw_update + wire_encode + crc32c, and the gradient reduction exactly those of summing in
// source order + sum_of_squares, for any thread count and any block size.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "pdtrain/core/crc32c.hpp"
#include "pdtrain/pd/holder_update.hpp"

namespace pdtrain {
namespace {

std::vector<float> wave(std::int64_t n, float f, float scale) {
  std::vector<float> x(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) x[i] = std::sin(f * static_cast<float>(i) + 0.3f) * scale;
  return x;
}

BlockState initial_state(std::int64_t n, bool decay) {
  BlockState s;
  s.param = wave(n, 0.173f, 0.05f);
  s.m.assign(static_cast<std::size_t>(n), 0.0f);
  s.v.assign(static_cast<std::size_t>(n), 0.0f);
  s.decay = decay;
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Sizes around the slice boundaries: one element, under a slice, exactly one, one more, several
// plus a remainder.
const std::vector<std::int64_t> kSizes = {
    1, 1000, kUpdateSliceFloats, kUpdateSliceFloats + 1, 3 * kUpdateSliceFloats + 17, 50000};

void expect_fused_equals_serial(WireCodec codec, bool in_place, int threads, std::int64_t slice) {
  AdamWConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.grad_clip = 1.0;
  WorkerPool pool(threads);
  std::vector<BlockState> fused, serial;
  for (std::size_t b = 0; b < kSizes.size(); ++b) {
    fused.push_back(initial_state(kSizes[b], b % 2 == 0));
    serial.push_back(fused.back());
  }
  std::vector<std::vector<char>> encoded(kSizes.size());
  for (std::int64_t step = 1; step <= 3; ++step) {  // moments become non-zero after step 1
    const double lr = 1e-3 * static_cast<double>(step);
    const float scale = 0.75f;
    std::vector<std::vector<float>> grads;
    std::vector<FusedUpdate::Block> blocks;
    for (std::size_t b = 0; b < kSizes.size(); ++b) {
      grads.push_back(wave(kSizes[b], 0.031f * static_cast<float>(step + b), 0.2f));
      FusedUpdate::Block blk;
      blk.state = &fused[b];
      blk.grad = grads[b].data();
      blk.step = adamw_step(cfg, step, lr, scale, fused[b].decay);
      blk.encoded = in_place ? nullptr : &encoded[b];
      blocks.push_back(blk);
    }
    FusedUpdate update(codec, std::move(blocks), slice);
    update.start(pool);
    pool.wait();
    for (std::size_t b = 0; b < kSizes.size(); ++b) {
      SCOPED_TRACE("block " + std::to_string(b) + " of " + std::to_string(kSizes[b]) +
                   " elements, step " + std::to_string(step));
      ASSERT_TRUE(update.done(b));
      adamw_update(cfg, step, lr, scale, grads[b].data(), serial[b]);
      std::vector<char> want;
      wire_encode(codec, serial[b].param.data(), kSizes[b], want);
      EXPECT_TRUE(same_bits(fused[b].param, serial[b].param));
      EXPECT_TRUE(same_bits(fused[b].m, serial[b].m));
      EXPECT_TRUE(same_bits(fused[b].v, serial[b].v));
      if (!in_place) {
        EXPECT_EQ(encoded[b], want);
      }
      EXPECT_EQ(update.block(b).crc, crc32c(want.data(), want.size()));
    }
  }
}

TEST(FusedUpdate, EqualsTheSerialUpdateEncodeAndCrcForAnyThreadCount) {
  for (int threads : {1, 2, 3})
    for (std::int64_t slice : {kUpdateSliceFloats, std::int64_t{1000}}) {
      SCOPED_TRACE(std::to_string(threads) + " threads, slices of " + std::to_string(slice));
      expect_fused_equals_serial(WireCodec::raw, false, threads, slice);
      expect_fused_equals_serial(WireCodec::raw, true, threads, slice);  // served in place
      expect_fused_equals_serial(WireCodec::bf16, false, threads, slice);
      expect_fused_equals_serial(WireCodec::lz4, false, threads, slice);
    }
}

TEST(ReduceGradient, EqualsTheSourceOrderSumAndChunkedSumOfSquares) {
  WorkerPool two(2), three(3);
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{3 * 4096 + 13}, std::int64_t{40 * 4096 + 5}})
    for (std::size_t contributions : {1u, 2u, 3u}) {
      std::vector<std::vector<float>> c;
      for (std::size_t k = 0; k < contributions; ++k)
        c.push_back(wave(n, 0.011f * static_cast<float>(k + 1), 1e-2f * static_cast<float>(k + 1)));
      // The serial reference: contributions added in order, then the chunked sum of squares.
      std::vector<float> want = c[0];
      for (std::size_t k = 1; k < contributions; ++k)
        for (std::int64_t i = 0; i < n; ++i) want[i] += c[k][i];
      const double want_sumsq = sum_of_squares(want.data(), n);
      for (WorkerPool* pool : {static_cast<WorkerPool*>(nullptr), &two, &three}) {
        SCOPED_TRACE(std::to_string(n) + " elements, " + std::to_string(contributions) +
                     " contributions, " + std::to_string(pool ? pool->threads() : 0) + " workers");
        std::vector<float> sum = c[0];
        std::vector<const float*> others;
        for (std::size_t k = 1; k < contributions; ++k) others.push_back(c[k].data());
        const double sumsq = reduce_gradient(pool, sum.data(), others, n);
        EXPECT_TRUE(same_bits(sum, want));
        EXPECT_EQ(std::memcmp(&sumsq, &want_sumsq, sizeof(double)), 0)
            << sumsq << " " << want_sumsq;
      }
    }
}

// A raw push ingested in one pass (copy, CRC, sum of squares) equals memcpy + crc32c +
// sum_of_squares, from any alignment of the received bytes.
TEST(IngestRawGradient, EqualsCopyThenCrcThenSumOfSquares) {
  WorkerPool three(3);
  for (std::int64_t n :
       {std::int64_t{1}, std::int64_t{4096 * 4 + 3}, std::int64_t{30 * 4096 + 1000}}) {
    const std::vector<float> g = wave(n, 0.021f, 0.3f);
    std::vector<char> wire(static_cast<std::size_t>(n) * 4 + 1);
    std::memcpy(wire.data() + 1, g.data(), static_cast<std::size_t>(n) * 4);  // misaligned
    const std::uint32_t want_crc = crc32c(g.data(), static_cast<std::size_t>(n) * 4);
    const double want_sumsq = sum_of_squares(g.data(), n);
    for (WorkerPool* pool : {static_cast<WorkerPool*>(nullptr), &three}) {
      SCOPED_TRACE(std::to_string(n) + " elements, pool " + (pool ? "3" : "none"));
      std::vector<float> got(static_cast<std::size_t>(n));
      double sumsq = -1.0;
      EXPECT_EQ(ingest_raw_gradient(pool, wire.data() + 1, got.data(), n, &sumsq), want_crc);
      EXPECT_TRUE(same_bits(got, g));
      EXPECT_EQ(std::memcmp(&sumsq, &want_sumsq, sizeof(double)), 0);
      std::vector<float> again(static_cast<std::size_t>(n));
      EXPECT_EQ(ingest_raw_gradient(pool, wire.data() + 1, again.data(), n, nullptr), want_crc);
    }
  }
}

TEST(WorkerPool, RunsEveryTaskOnceAndCanBeReused) {
  WorkerPool pool(3);
  for (int batch = 0; batch < 3; ++batch) {
    std::vector<std::atomic<int>> hits(1000);
    pool.run(1000, [&](std::int64_t i) { hits[static_cast<std::size_t>(i)]++; });
    for (const auto& h : hits) EXPECT_EQ(h.load(), 1);
  }
  pool.run(0, [](std::int64_t) { ADD_FAILURE() << "no task expected"; });
}

// 0: the cores this process is bound to, or unbound its share among the node's ranks.
TEST(HolderThreads, ZeroMeansTheCoresThisProcessMayUse) {
  EXPECT_GE(usable_cores(), 1);
  EXPECT_EQ(resolve_holder_threads(0), std::min(usable_cores(), kMaxAutoHolderThreads));
  const bool bound = usable_cores() < sysconf(_SC_NPROCESSORS_ONLN);
  const int shared = bound ? usable_cores() : usable_cores() / 4;
  EXPECT_EQ(resolve_holder_threads(0, 4), std::clamp(shared, 1, kMaxAutoHolderThreads));
  EXPECT_EQ(resolve_holder_threads(0, 1000), bound ? resolve_holder_threads(0) : 1);
  EXPECT_EQ(resolve_holder_threads(3, 4), 3);  // what the deck says
}

}  // namespace
}  // namespace pdtrain
