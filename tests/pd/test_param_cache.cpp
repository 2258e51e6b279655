// ParamCache against an in-memory parameter service: every use finds its unit's data of the
// pass's version, the capacity is never exceeded, evictions follow Belady's rule (fewest
// fetches for a known order), prefetching keeps `depth` uses in flight, and uses out of plan
// end the job (a logic error on one rank: fatal, not a collective deck error).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "pdtrain/core/error.hpp"
#include "pdtrain/pd/param_cache.hpp"
#include "pdtrain/pd/parameter_service.hpp"

#include "../support/fake_parameter_service.hpp"

namespace pdtrain {
namespace {

// Block b of version v holds fake_block_value(v, b, i). One block per unit here, so block id ==
// unit id.
using test::fake_block_value;
using test::FakeService;

// The model side: storage bound per unit, checked on every use.
class FakeStore final : public UnitStore {
 public:
  explicit FakeStore(int units) : bound(static_cast<std::size_t>(units), nullptr) {}
  void bind(int unit, float* storage, float*) override { bound[unit] = storage; }
  void unpack(int block, const float* data) override {
    std::copy_n(data, numel_of(block), bound[block]);
  }
  std::function<std::int64_t(int)> numel_of;
  std::vector<float*> bound;
};

struct Fixture {
  explicit Fixture(std::vector<std::int64_t> numel, std::int64_t capacity_bytes, int depth)
      : service(numel), store(static_cast<int>(numel.size())),
        cache(service, units(numel), store, capacity_bytes, depth) {
    store.numel_of = [numel](int b) { return numel[b]; };
  }
  static std::vector<CacheUnit> units(const std::vector<std::int64_t>& numel) {
    std::vector<CacheUnit> u;
    for (std::size_t i = 0; i < numel.size(); ++i)
      u.push_back({"u" + std::to_string(i), numel[i], {static_cast<int>(i)}});
    return u;
  }
  // Runs one pass, checking every use's data.
  void pass(std::int64_t version, const std::vector<std::vector<int>>& plan) {
    cache.begin(version, plan);
    for (const auto& use : plan) {
      cache.acquire(use);
      for (int u : use) {
        ASSERT_NE(store.bound[u], nullptr);
        EXPECT_EQ(store.bound[u][0], fake_block_value(version, u, 0)) << "unit " << u;
        EXPECT_EQ(store.bound[u][5], fake_block_value(version, u, 5)) << "unit " << u;
      }
    }
    cache.end();
  }
  FakeService service;
  FakeStore store;
  ParamCache cache;
};

// Forward over 4 layers then backward: the order a one-stage step uses them.
const std::vector<std::vector<int>> kStep = {{0}, {1}, {2}, {3}, {3}, {2}, {1}, {0}};

TEST(ParamCache, UnlimitedFetchesEachUnitOncePerVersion) {
  Fixture f({100, 100, 100, 100}, 0, 2);
  f.pass(0, kStep);
  f.pass(0, kStep);  // same version (evaluation after a step): all hits
  EXPECT_EQ(f.cache.stats().fetches, 4);
  EXPECT_EQ(f.cache.stats().hits, 12);
  f.pass(1, kStep);  // a new version drops everything
  EXPECT_EQ(f.cache.stats().fetches, 8);
  EXPECT_EQ(f.cache.stats().bytes_refetched, 0);
}

TEST(ParamCache, BoundedCacheNeverExceedsItsCapacityAndRefetches) {
  const std::int64_t unit_bytes = 100 * 4;
  Fixture f({100, 100, 100, 100}, 2 * unit_bytes, 1);
  f.pass(0, kStep);
  EXPECT_LE(f.cache.stats().peak_bytes, 2 * unit_bytes);
  // Belady with room for two of four units over 0 1 2 3 3 2 1 0: 2 evicts 0 (next use 7, not
  // 1's 6), 3 evicts 1 (6, not 2's 5), then 1 and 0 come back: six fetches, the optimum.
  EXPECT_EQ(f.cache.stats().fetches, 6);
  EXPECT_EQ(f.cache.stats().bytes_refetched, 2 * unit_bytes);
}

// The cold start: no limit for the first passes, then a capacity that applies from the next
// pass's begin (evicting down to it there, farthest next use first, and releasing buffers), so
// each pass's peak is the whole stage while warm and within the bound after.
TEST(ParamCache, CapacityChangesAtTheNextPassBegin) {
  const std::int64_t unit_bytes = 100 * 4;
  Fixture f({100, 100, 100, 100}, 0, 2);
  f.pass(0, kStep);
  EXPECT_EQ(f.cache.stats().pass_peak_bytes, 4 * unit_bytes);
  EXPECT_EQ(f.cache.stats().fetches, 4);
  f.cache.set_capacity(2 * unit_bytes);
  EXPECT_EQ(f.cache.capacity_bytes(), 0);  // not before the next pass
  f.pass(0, kStep);  // same version: units 3 and 2 (used last) are evicted at begin
  EXPECT_EQ(f.cache.capacity_bytes(), 2 * unit_bytes);
  EXPECT_LE(f.cache.stats().pass_peak_bytes, 2 * unit_bytes);
  EXPECT_GT(f.cache.stats().fetches, 4);  // evicted units come back
  f.pass(1, kStep);
  EXPECT_LE(f.cache.stats().pass_peak_bytes, 2 * unit_bytes);
  EXPECT_EQ(f.cache.stats().peak_bytes, 4 * unit_bytes);
  f.cache.set_capacity(0);  // and back (a schedule may loosen again)
  f.pass(2, kStep);
  EXPECT_EQ(f.cache.stats().pass_peak_bytes, 4 * unit_bytes);
}

TEST(ParamCache, BeladyBeatsLeastRecentlyUsedOnALoop) {
  // A cyclic order 0 1 2 0 1 2 0 1 2 with room for two: LRU misses every use (9 fetches);
  // evicting the farthest next use fetches 0 1 2(evicts 1) 1(evicts 0) 0(evicts 2) 2: six.
  const std::int64_t unit_bytes = 10 * 4;
  Fixture f({10, 10, 10}, 2 * unit_bytes, 0);
  std::vector<std::vector<int>> plan;
  for (int r = 0; r < 3; ++r)
    for (int u = 0; u < 3; ++u) plan.push_back({u});
  f.pass(0, plan);
  EXPECT_EQ(f.cache.stats().fetches, 6);
}

TEST(ParamCache, PrefetchKeepsDepthUsesInFlight) {
  for (int depth : {0, 1, 3}) {
    Fixture f({10, 10, 10, 10, 10, 10}, 0, depth);
    std::vector<std::vector<int>> plan;
    for (int u = 0; u < 6; ++u) plan.push_back({u});
    f.pass(0, plan);
    EXPECT_EQ(f.service.max_in_flight, std::max(1, depth)) << depth;
    EXPECT_EQ(f.service.started, (std::vector<int>{0, 1, 2, 3, 4, 5}));
    // Without prefetch every use misses; with it only the first (or none is a hit: the first
    // use's fetch starts at begin()).
    if (depth == 0) EXPECT_EQ(f.cache.stats().misses, 6);
    if (depth > 0) EXPECT_EQ(f.cache.stats().misses, 0);
  }
}

TEST(ParamCache, PrefetchNeverEvictsAUnitNeededSooner) {
  // Room for two units; the current use is 0 and 1 is next, 2 comes later: prefetching 2 must
  // not evict 1.
  const std::int64_t unit_bytes = 10 * 4;
  Fixture f({10, 10, 10}, 2 * unit_bytes, 3);
  f.pass(0, {{0}, {1}, {2}, {1}});
  EXPECT_EQ(f.cache.stats().fetches, 3);
}

TEST(ParamCache, MultiUnitUsesAndMinimumCapacity) {
  const std::vector<std::int64_t> numel = {50, 10, 20};
  const std::vector<std::vector<int>> plan = {{0, 1}, {2}, {2, 0}};
  EXPECT_EQ(ParamCache::min_capacity_bytes(Fixture::units(numel), plan), 70 * 4);
  Fixture f(numel, 70 * 4, 2);
  f.pass(0, plan);
  EXPECT_LE(f.cache.stats().peak_bytes, 70 * 4);
}

TEST(ParamCache, UseOutOfPlanIsRefused) {
  Fixture f({10, 10}, 0, 1);
  f.cache.begin(0, {{0}, {1}});
  EXPECT_DEATH(f.cache.acquire({1}), "use 0 of the pass is not the planned one");
}

TEST(ParamCache, EndingEarlyIsRefused) {
  Fixture f({10, 10}, 0, 0);
  f.cache.begin(0, {{0}, {1}});
  f.cache.acquire({0});
  EXPECT_DEATH(f.cache.end(), "ended after 1 of 2 planned uses");
}

}  // namespace
}  // namespace pdtrain
