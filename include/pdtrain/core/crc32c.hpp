#pragma once
// CRC32C (Castagnoli), the checksum on every block on the wire and in checkpoints.
// Backed by Intel ISA-L's hardware-accelerated crc32_iscsi.
#include <cstddef>
#include <cstdint>

namespace pdtrain {

// Standard CRC32C of `n` bytes (check value: crc32c("123456789") == 0xE3069283).
std::uint32_t crc32c(const void* data, std::size_t n);

// Continues a running CRC32C: crc32c_extend(crc32c(a), b) == crc32c(a ++ b).
std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n);

// The CRC of a concatenation from its parts' CRCs: crc32c_combine(crc32c(a), crc32c(b), |b|) ==
// crc32c(a ++ b). Lets threads checksum the slices of a block in parallel, each while the slice
// is in cache, and the block's CRC be assembled in slice order (O(log |b|), no data touched).
std::uint32_t crc32c_combine(std::uint32_t crc_a, std::uint32_t crc_b, std::size_t bytes_b);

}  // namespace pdtrain
