#pragma once
// Where holders and blocks go. Blocks: contiguous runs balanced by the bytes each holder serves
// per step, and on several nodes preferably a holder on the node of the ranks that fetch them.
// Holders: the job's ranks reordered so that holders sit on different nodes. Pure functions of
// sizes and node numbers (the app gives the blocks each fetching rank reads).
#include <cstdint>
#include <vector>

#include "pdtrain/layout/layout.hpp"

namespace pdtrain {

// Which holder owns each block: contiguous runs of blocks balanced by bytes, so every holder
// serves about the same bytes per step. Returns owner[block].
std::vector<int> place_blocks(const std::vector<std::int64_t>& block_bytes, int holders);

// Placement near the fetchers: `served[b]` is the bytes holders send per step for block b,
// `block_node[b]` the node most of its fetching ranks run on, `holder_node[h]` holder h's node.
// Every holder serves about the same bytes; within that, a block goes to a holder on its
// node when one has room. One node: place_blocks(served, H).
std::vector<int> place_blocks_near(const std::vector<std::int64_t>& served,
                                   const std::vector<int>& block_node,
                                   const std::vector<int>& holder_node);

// A rank that fetches blocks from the holders every step: its node and the blocks it reads.
struct Fetcher {
  int node = 0;
  std::vector<int> blocks;
};

// Blocks go to holders by the bytes they serve per step (block_bytes[b] once per fetcher of b),
// on the node where most of their fetchers run (the lowest such node on a tie) when a holder is
// there; holder_node[h] is holder h's node. Returns owner[block].
std::vector<int> place_near_fetchers(const std::vector<std::int64_t>& block_bytes,
                                     const std::vector<Fetcher>& fetchers,
                                     const std::vector<int>& holder_node);

// Holders are ranks 0..holders-1 of the run's communicator. Launchers fill nodes in rank order,
// so on several nodes the job's ranks are reordered to put the holders on different nodes
// (holder h on node h mod nodes), each serving the fetchers nearest it; on one node nothing
// moves. `job_node[r]` is the node of job rank r. Returns the job rank of each rank of the run.
std::vector<int> spread_holders(int holders, const std::vector<int>& job_node);

// Which links the compute grid's collective groups cross: per kind of group (tensor-parallel,
// pipeline, data-parallel), how many groups lie within one node (NVLink / shared memory) and
// how many span nodes (the network). The grid puts tp fastest, so tp groups stay inside a node
// whenever tp divides the compute ranks per node, pipeline stages next, replicas outermost.
// `node[r]` is the node of run rank r (holders first).
struct GroupLinks {
  int intra_node = 0, inter_node = 0;
};
struct GridLinks {
  GroupLinks tp, pp, dp;
};
GridLinks grid_links(const LayoutShape& shape, const std::vector<int>& node);

}  // namespace pdtrain
