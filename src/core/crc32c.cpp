#include "pdtrain/core/crc32c.hpp"

#include <isa-l/crc.h>

#include <climits>

namespace pdtrain {

std::uint32_t crc32c_extend(std::uint32_t crc, const void* data, std::size_t n) {
  // ISA-L's crc32_iscsi keeps the register un-inverted between calls; the standard CRC32C
  // inverts on entry and exit.
  auto* p = static_cast<unsigned char*>(const_cast<void*>(data));
  std::uint32_t reg = ~crc;
  while (n > 0) {
    const int chunk = n > static_cast<std::size_t>(INT_MAX / 2) ? INT_MAX / 2 : static_cast<int>(n);
    reg = crc32_iscsi(p, chunk, reg);
    p += chunk;
    n -= static_cast<std::size_t>(chunk);
  }
  return ~reg;
}

std::uint32_t crc32c(const void* data, std::size_t n) { return crc32c_extend(0u, data, n); }

}  // namespace pdtrain
