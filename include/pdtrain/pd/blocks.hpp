#pragma once
// What the PD layer knows about parameters: blocks by id, their sizes, whether they take
// weight decay, and a name for messages. Nothing about the model's shapes.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace pdtrain {

struct BlockDesc {
  std::int64_t numel = 0;
  bool decay = false;
  std::string name;
  // Where a forward first needs the block: blocks of a lower rank are read earlier (the model
  // gives the embedding 0, layer l l + 1, the final LayerNorm n_layer + 1). Holders update and
  // publish their blocks in this order, so that the next step's forward follows the update's
  // front instead of waiting for most of it. Equal ranks: by id.
  std::int64_t need_rank = 0;
};

struct BlockTable {
  std::vector<BlockDesc> blocks;
  // Fills the initial values of block `id` (deterministic, layout-independent). Safe to call
  // for different blocks from several threads at once.
  std::function<void(int id, float* out)> init;
  // Threads that fill_initial_values may use (the app: this rank's share of its node's cores).
  int init_threads = 1;
  // CRC32C of all parameters in canonical order, given every block's data by id.
  std::function<std::uint32_t(const std::vector<const float*>& block_data)> canonical_crc;
};

// Fills every listed block's initial values (block id, where they go) through table.init, on up
// to table.init_threads threads, one block at a time each: the values are the same for any
// thread count. GPT-2 124M's values: a normal deviate for each of 124 M parameters.
void fill_initial_values(const BlockTable& table, const std::vector<std::pair<int, float*>>& blocks);

// `blocks` grouped by their holder (owner[id], of `holders`), each group in the given order.
std::vector<std::vector<int>> group_by_owner(const std::vector<int>& blocks,
                                             const std::vector<int>& owner, int holders);

}  // namespace pdtrain
