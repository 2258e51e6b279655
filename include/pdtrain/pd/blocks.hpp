#pragma once
// What the PD layer knows about parameters: blocks by id, their sizes, whether they take
// weight decay, and a name for messages. Nothing about the model's shapes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace pdtrain {

struct BlockDesc {
  std::int64_t numel = 0;
  bool decay = false;
  std::string name;
};

struct BlockTable {
  std::vector<BlockDesc> blocks;
  // Fills the initial values of block `id` (deterministic, layout-independent).
  std::function<void(int id, float* out)> init;
  // CRC32C of all parameters in canonical order, given every block's data by id.
  std::function<std::uint32_t(const std::vector<const float*>& block_data)> canonical_crc;
};

}  // namespace pdtrain

// pd/param_cache.hpp still reaches ParameterService through this header; once it includes
// parameter_service.hpp itself, this include can go.
#include "pdtrain/pd/parameter_service.hpp"
