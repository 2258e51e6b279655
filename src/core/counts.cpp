#include "pdtrain/core/counts.hpp"

#include <algorithm>
#include <climits>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

std::vector<std::int64_t> split_evenly(std::int64_t n, int parts) {
  std::vector<std::int64_t> counts(static_cast<std::size_t>(parts));
  for (int r = 0; r < parts; ++r) counts[r] = n * (r + 1) / parts - n * r / parts;
  return counts;
}

std::vector<MessagePiece> message_pieces(std::int64_t n, std::int64_t max_piece) {
  PDT_CHECK(max_piece >= 1 && max_piece <= INT_MAX, "message pieces must hold 1..INT_MAX elements");
  std::vector<MessagePiece> pieces;
  for (std::int64_t at = 0; at < n; at += max_piece)
    pieces.push_back({at, static_cast<int>(std::min(max_piece, n - at))});
  return pieces;
}

}  // namespace pdtrain
