// Block and holder placement (pure functions: no MPI needed).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "pdtrain/layout/placement.hpp"

namespace pdtrain {
namespace {

TEST(PlaceBlocks, ContiguousAndBalancedByBytes) {
  const std::vector<std::int64_t> bytes = {100, 100, 100, 100, 400, 100, 100, 100};
  const std::vector<int> owner = place_blocks(bytes, 2);
  for (std::size_t i = 1; i < owner.size(); ++i) EXPECT_GE(owner[i], owner[i - 1]);
  std::int64_t load[2] = {0, 0};
  for (std::size_t i = 0; i < owner.size(); ++i) load[owner[i]] += bytes[i];
  EXPECT_LE(std::abs(load[0] - load[1]), 400);
  EXPECT_EQ(place_blocks(bytes, 1), std::vector<int>(bytes.size(), 0));
  // More holders than blocks: every block placed on a valid holder.
  for (int o : place_blocks({4, 4}, 5)) EXPECT_LT(o, 5);
}

TEST(PlaceBlocksNear, OneNodeIsTheContiguousBalancedPlacement) {
  const std::vector<std::int64_t> served = {40, 10, 10, 20, 30, 10, 40};
  EXPECT_EQ(place_blocks_near(served, std::vector<int>(7, 0), {0, 0, 0}),
            place_blocks(served, 3));
}

TEST(PlaceBlocksNear, BlocksStayOnTheirNodeWhenBalanceAllows) {
  // Blocks 0-3 are fetched from node 0, 4-7 from node 1; one holder per node.
  const std::vector<std::int64_t> served(8, 100);
  const std::vector<int> owner =
      place_blocks_near(served, {0, 0, 0, 0, 1, 1, 1, 1}, std::vector<int>{0, 1});
  EXPECT_EQ(owner, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
}

TEST(PlaceBlocksNear, BalanceWinsOverLocality) {
  // Every block is fetched on node 0 but holders sit on nodes 0 and 1: each still serves half.
  const std::vector<std::int64_t> served(10, 100);
  const std::vector<int> owner = place_blocks_near(served, std::vector<int>(10, 0), {0, 1});
  std::int64_t load[2] = {0, 0};
  for (std::size_t b = 0; b < owner.size(); ++b) load[owner[b]] += served[b];
  EXPECT_EQ(load[0], 500);
  EXPECT_EQ(load[1], 500);
  EXPECT_EQ(owner[0], 0);  // node 0's holder is filled first
}

TEST(PlaceNearFetchers, BytesServedCountEveryFetcherAndBlocksFollowTheirFetchersNode) {
  // Four blocks of 100 bytes; one holder on each of nodes 0 and 1. Blocks 0-1 are fetched on
  // node 0, blocks 2-3 on node 1; block 1 also by a second fetcher on node 1 (a tie: node 0).
  const std::vector<Fetcher> fetchers = {{0, {0, 1}}, {1, {1}}, {1, {2, 3}}};
  const std::vector<int> owner = place_near_fetchers({100, 100, 100, 100}, fetchers, {0, 1});
  EXPECT_EQ(owner, (std::vector<int>{0, 0, 1, 1}));
  // What that is: block 1 serves two copies, and the vote decides each block's node.
  EXPECT_EQ(owner, place_blocks_near({100, 200, 100, 100}, {0, 0, 1, 1}, {0, 1}));
}

TEST(PlaceNearFetchers, TheMajorityNodeWins) {
  const std::vector<Fetcher> fetchers = {{0, {0}}, {1, {0}}, {1, {0}}, {0, {1}}};
  // Block 0: three copies, two of them fetched on node 1, so node 1's holder serves it.
  EXPECT_EQ(place_near_fetchers({100, 100}, fetchers, {0, 1}), (std::vector<int>{1, 0}));
}

TEST(SpreadHolders, OneNodeKeepsTheJobOrder) {
  EXPECT_EQ(spread_holders(2, {0, 0, 0, 0, 0}), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SpreadHolders, HoldersGoToDifferentNodes) {
  // Two nodes of three ranks: holder 1 is the first rank of node 1, the rest keep their order.
  EXPECT_EQ(spread_holders(2, {0, 0, 0, 1, 1, 1}), (std::vector<int>{0, 3, 1, 2, 4, 5}));
  // More holders than nodes: holder h on node h mod nodes.
  EXPECT_EQ(spread_holders(3, {0, 0, 1, 1}), (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(spread_holders(3, {0, 0, 0, 1}), (std::vector<int>{0, 3, 1, 2}));
  // Node 0 has no rank left for holder 2: the first free rank takes it.
  EXPECT_EQ(spread_holders(3, {0, 1, 1, 1}), (std::vector<int>{0, 1, 2, 3}));
}

TEST(GridLinks, TensorGroupsInsideANodePipelineAcrossReplicasOutermost) {
  // 1 holder + dp 2 x pp 2 x tp 2 on 4-rank nodes: holder 0 and compute ranks 1..3 on node 0,
  // 4..7 on node 1, 8 on node 2.
  LayoutShape s;
  s.holders = 1;
  s.dp = 2;
  s.pp = 2;
  s.tp = 2;
  const std::vector<int> node = {0, 0, 0, 0, 1, 1, 1, 1, 2};
  const GridLinks l = grid_links(s, node);
  // tp groups {1,2} {3,4} {5,6} {7,8}: two within a node, two across.
  EXPECT_EQ(l.tp.intra_node, 2);
  EXPECT_EQ(l.tp.inter_node, 2);
  // pp groups {1,3} {2,4} {5,7} {6,8}: {1,3} and {5,7} within.
  EXPECT_EQ(l.pp.intra_node, 2);
  EXPECT_EQ(l.pp.inter_node, 2);
  // dp groups {1,5} {2,6} {3,7} {4,8}: all across.
  EXPECT_EQ(l.dp.intra_node, 0);
  EXPECT_EQ(l.dp.inter_node, 4);
  // One node: every group within it.
  const GridLinks one = grid_links(s, std::vector<int>(9, 0));
  EXPECT_EQ(one.tp.inter_node + one.pp.inter_node + one.dp.inter_node, 0);
  EXPECT_EQ(one.tp.intra_node + one.pp.intra_node + one.dp.intra_node, 4 + 4 + 4);
}

}  // namespace
}  // namespace pdtrain
