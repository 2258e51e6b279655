#pragma once
// Where a block lies in memory that is not packed for the wire: a tile of rows (elements of the
// wire's width, row-major; rows `stride_bytes` apart), the block's part of a local tensor.
// BlockPlace is where a fetched block can land directly (`data == nullptr`: nowhere, the block
// goes through a receive buffer); ConstBlockPlace is where a pushed gradient is read from. Shared
// by the fetch layer (pd/) and the model's storage (model/), which says where its blocks live.
#include <cstdint>
#include <cstring>

namespace pdtrain {

template <class Byte>
struct BasicBlockPlace {
  Byte* data = nullptr;
  std::int64_t rows = 0, row_bytes = 0, stride_bytes = 0;
  bool contiguous() const { return rows <= 1 || stride_bytes == row_bytes; }
  std::int64_t bytes() const { return rows * row_bytes; }
};

using BlockPlace = BasicBlockPlace<char>;
using ConstBlockPlace = BasicBlockPlace<const char>;

// Copies the block's rows back to back to `to` (the block packed, as the wire has it); returns
// the end of what it wrote.
inline char* pack_rows(const ConstBlockPlace& from, char* to) {
  for (std::int64_t r = 0; r < from.rows; ++r, to += from.row_bytes)
    std::memcpy(to, from.data + r * from.stride_bytes, static_cast<std::size_t>(from.row_bytes));
  return to;
}

// Copies a packed block (rows back to back, as the wire has it) into its rows at `to`.
inline void unpack_rows(const char* from, const BasicBlockPlace<char>& to) {
  for (std::int64_t r = 0; r < to.rows; ++r, from += to.row_bytes)
    std::memcpy(to.data + r * to.stride_bytes, from, static_cast<std::size_t>(to.row_bytes));
}

}  // namespace pdtrain
