#include "pdtrain/ckpt/canonical_crc.hpp"

#include <algorithm>

#include "pdtrain/core/crc32c.hpp"

namespace pdtrain::ckpt {

// One implementation, in core/ (the holders assemble block CRCs from slices with it too).
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b) {
  return pdtrain::crc32c_combine(crc_a, crc_b, static_cast<std::size_t>(len_b));
}

void append_crc_pieces(const ParamCatalog& catalog, const BlockInfo& b, const float* packed,
                       std::vector<CrcPiece>& out) {
  const TensorInfo& t = catalog.tensor(b.tensor);
  if (b.cols == t.cols) {  // full rows: the whole block is contiguous in canonical order
    out.push_back({catalog.canonical_index(b, 0, 0), b.numel(),
                   crc32c(packed, static_cast<std::size_t>(b.numel()) * sizeof(float))});
    return;
  }
  for (std::int64_t r = 0; r < b.rows; ++r)
    out.push_back({catalog.canonical_index(b, r, 0), b.cols,
                   crc32c(packed + r * b.cols, static_cast<std::size_t>(b.cols) * sizeof(float))});
}

std::optional<std::uint32_t> combine_crc_pieces(std::vector<CrcPiece> pieces,
                                                std::int64_t total_numel) {
  std::sort(pieces.begin(), pieces.end(),
            [](const CrcPiece& a, const CrcPiece& b) { return a.offset < b.offset; });
  std::uint32_t crc = 0;  // CRC32C of the empty string
  std::int64_t end = 0;
  for (const CrcPiece& p : pieces) {
    if (p.offset != end) return std::nullopt;  // a gap or an overlap
    crc = crc32c_combine(crc, p.crc, static_cast<std::uint64_t>(p.count) * sizeof(float));
    end += p.count;
  }
  if (end != total_numel) return std::nullopt;
  return crc;
}

}  // namespace pdtrain::ckpt
