#pragma once
// Counts and displacements: parts of a buffer laid back to back in rank (or block) order, as
// MPI's v-collectives and the fixed-order reduction describe them.
#include <cstdint>
#include <vector>

namespace pdtrain {

// Where each part starts when parts of counts[i] elements lie back to back (the exclusive
// prefix sum: 0, c0, c0+c1, ...).
template <class Count>
std::vector<Count> displacements(const std::vector<Count>& counts) {
  std::vector<Count> starts(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) starts[i] = starts[i - 1] + counts[i - 1];
  return starts;
}

// `n` elements cut into `parts` contiguous parts whose sizes differ by at most one: part r is
// [n*r/parts, n*(r+1)/parts).
std::vector<std::int64_t> split_evenly(std::int64_t n, int parts);

// A message of `n` elements sent as pieces of at most `max_piece` elements each, because MPI
// counts are int: (offset, count) in order; none for n = 0.
struct MessagePiece {
  std::int64_t offset = 0;
  int count = 0;
};
std::vector<MessagePiece> message_pieces(std::int64_t n, std::int64_t max_piece);

}  // namespace pdtrain
