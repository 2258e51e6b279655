#pragma once
// The CRC32C of all parameters in canonical (llm.c) order -- the number the run prints as
// `params_crc32c` -- computed from pieces held by different holders. Blocks of row-parallel
// tensors are column slabs, so a block is one contiguous piece of the canonical array only
// when it spans full rows; otherwise each of its rows is a piece. CRC32C is linear, so the
// CRCs of the pieces, ordered by offset, combine into the CRC of the whole.
#include <cstdint>
#include <optional>
#include <vector>

#include "pdtrain/model/catalog.hpp"

namespace pdtrain::ckpt {

// crc32c(A ++ B) from crc32c(A), crc32c(B) and the length of B in bytes.
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::uint64_t len_b);

// One contiguous piece of the canonical array: element offset, element count, CRC32C of its
// fp32 bytes.
struct CrcPiece {
  std::int64_t offset, count;
  std::uint32_t crc;
};

// Appends the pieces of block `b` whose packed data is `packed`.
void append_crc_pieces(const ParamCatalog& catalog, const BlockInfo& b, const float* packed,
                       std::vector<CrcPiece>& out);

// Combines pieces (any order) into the canonical CRC; nullopt unless they tile
// [0, total_numel) exactly.
std::optional<std::uint32_t> combine_crc_pieces(std::vector<CrcPiece> pieces,
                                                std::int64_t total_numel);

}  // namespace pdtrain::ckpt
