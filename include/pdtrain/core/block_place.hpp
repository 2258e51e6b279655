#pragma once
// Receiving in place: where a block's wire payload can land directly, a tile of rows in the
// receiver's memory (elements of the wire's width, row-major; rows `stride_bytes` apart).
// `data == nullptr`: nowhere, the block goes through a receive buffer. Shared by the fetch
// layer (pd/) and the model's parameter storage (model/), which says where its blocks live.
#include <cstdint>

namespace pdtrain {

struct BlockPlace {
  char* data = nullptr;
  std::int64_t rows = 0, row_bytes = 0, stride_bytes = 0;
  bool contiguous() const { return rows <= 1 || stride_bytes == row_bytes; }
  std::int64_t bytes() const { return rows * row_bytes; }
};

}  // namespace pdtrain
