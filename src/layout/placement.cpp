#include "pdtrain/layout/placement.hpp"

#include <algorithm>

namespace pdtrain {

namespace {
// The value that occurs most often in `values` (the smallest of those on a tie).
int most_common(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  int best = 0, best_count = 0;
  for (std::size_t i = 0; i < values.size();) {
    std::size_t j = i;
    while (j < values.size() && values[j] == values[i]) ++j;
    if (static_cast<int>(j - i) > best_count) best = values[i], best_count = static_cast<int>(j - i);
    i = j;
  }
  return best;
}
}  // namespace

std::vector<int> place_blocks(const std::vector<std::int64_t>& block_bytes, int holders) {
  std::vector<int> owner(block_bytes.size(), 0);
  if (holders <= 1) return owner;
  std::int64_t total = 0;
  for (auto b : block_bytes) total += b;
  // Block i goes to the holder whose byte range contains the middle of the block: contiguous,
  // balanced to within one block, and deterministic.
  std::int64_t before = 0;
  for (std::size_t i = 0; i < block_bytes.size(); ++i) {
    const std::int64_t mid2 = 2 * before + block_bytes[i];  // 2 x midpoint, avoids halves
    owner[i] = static_cast<int>(std::min<std::int64_t>(holders - 1, mid2 * holders / (2 * total)));
    before += block_bytes[i];
  }
  return owner;
}

std::vector<int> place_blocks_near(const std::vector<std::int64_t>& served,
                                   const std::vector<int>& block_node,
                                   const std::vector<int>& holder_node) {
  const int H = static_cast<int>(holder_node.size());
  const bool one_node = std::all_of(holder_node.begin(), holder_node.end(),
                                    [&](int n) { return n == holder_node[0]; }) &&
                        std::all_of(block_node.begin(), block_node.end(),
                                    [&](int n) { return n == holder_node[0]; });
  if (one_node) return place_blocks(served, H);
  // Balance first (every holder serves about total / H), locality second: blocks fill their
  // node's holders one after the other up to that share (contiguous runs, so a layer's blocks
  // come from few holders); what a node's holders cannot take, or a node without holders
  // needs, goes to the least-loaded holder.
  std::int64_t total = 0;
  for (auto b : served) total += b;
  const double share = static_cast<double>(total) / H;
  std::vector<double> load(static_cast<std::size_t>(H), 0.0);
  std::vector<int> owner(served.size(), 0);
  for (std::size_t b = 0; b < served.size(); ++b) {
    const double half = 0.5 * static_cast<double>(served[b]);
    int pick = -1;
    for (int h = 0; h < H && pick < 0; ++h)
      if (holder_node[h] == block_node[b] && load[h] + half <= share) pick = h;
    if (pick < 0) pick = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[b] = pick;
    load[pick] += static_cast<double>(served[b]);
  }
  return owner;
}

std::vector<int> place_near_fetchers(const std::vector<std::int64_t>& block_bytes,
                                     const std::vector<Fetcher>& fetchers,
                                     const std::vector<int>& holder_node) {
  const std::size_t n = block_bytes.size();
  std::vector<std::int64_t> served(n, 0);
  std::vector<std::vector<int>> votes(n);  // nodes of each block's fetchers
  for (const Fetcher& f : fetchers)
    for (int b : f.blocks) {
      served[b] += block_bytes[b];
      votes[b].push_back(f.node);
    }
  std::vector<int> block_node(n, 0);
  for (std::size_t b = 0; b < n; ++b) block_node[b] = most_common(std::move(votes[b]));
  return place_blocks_near(served, block_node, holder_node);
}

std::vector<int> spread_holders(int holders, const std::vector<int>& job_node) {
  const int n = static_cast<int>(job_node.size());
  const int nodes = 1 + *std::max_element(job_node.begin(), job_node.end());
  std::vector<bool> taken(job_node.size(), false);
  std::vector<int> job_rank;
  for (int h = 0; h < holders; ++h) {
    const int want = nodes > 1 ? h % nodes : 0;
    int pick = -1;
    for (int r = 0; r < n && pick < 0; ++r)
      if (!taken[r] && job_node[r] == want) pick = r;
    for (int r = 0; r < n && pick < 0; ++r)  // that node is full of holders already
      if (!taken[r]) pick = r;
    taken[pick] = true;
    job_rank.push_back(pick);
  }
  for (int r = 0; r < n; ++r)
    if (!taken[r]) job_rank.push_back(r);
  return job_rank;
}

namespace {

// Counts `group` (run ranks) as within one node or across nodes.
void count_group(const std::vector<int>& group, const std::vector<int>& node, GroupLinks* links) {
  bool one_node = true;
  for (int r : group) one_node = one_node && node[r] == node[group.front()];
  ++(one_node ? links->intra_node : links->inter_node);
}

}  // namespace

GridLinks grid_links(const LayoutShape& s, const std::vector<int>& node) {
  GridLinks links;
  std::vector<int> group;
  for (int d = 0; d < s.dp; ++d)
    for (int p = 0; p < s.pp; ++p) {
      group.clear();
      for (int t = 0; t < s.tp; ++t) group.push_back(s.compute_rank(d, p, t));
      count_group(group, node, &links.tp);
    }
  for (int d = 0; d < s.dp; ++d)
    for (int t = 0; t < s.tp; ++t) {
      group.clear();
      for (int p = 0; p < s.pp; ++p) group.push_back(s.compute_rank(d, p, t));
      count_group(group, node, &links.pp);
    }
  for (int p = 0; p < s.pp; ++p)
    for (int t = 0; t < s.tp; ++t) {
      group.clear();
      for (int d = 0; d < s.dp; ++d) group.push_back(s.compute_rank(d, p, t));
      count_group(group, node, &links.dp);
    }
  return links;
}

}  // namespace pdtrain
