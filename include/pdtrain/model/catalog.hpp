#pragma once
// The parameter catalogue: GPT-2's tensors in llm.c's order and shapes (so a checkpoint in
// llm.c's format is our canonical flat array), cut into blocks.
//
// A block is one tile of one layer's slice of a tensor, stored packed row-major: the unit of
// fetch, push, versioning, CRC and checkpoint chunking. Blocks are aligned with attention
// heads: every tensor that tensor parallelism splits is cut into n_head "units" along its
// split axis (rows for column-parallel weights, columns for row-parallel ones), so any tp that
// divides n_head owns whole blocks. qkv weights also split their rows into the q, k, v parts
// first, because a head's q, k and v rows are not adjacent in llm.c's layout.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/deck/deck.hpp"

namespace pdtrain {

struct ModelShape {
  std::int64_t n_layer, n_head, d_model, vocab_size, padded_vocab, seq_len, max_seq_len;
  std::int64_t head_size() const { return d_model / n_head; }
};
ModelShape resolve_model_shape(const ModelConfig& m);

// llm.c's 16 parameter tensors, in llm.c's order.
enum class TensorId : int {
  wte, wpe, ln1w, ln1b, qkvw, qkvb, attprojw, attprojb,
  ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, lnfw, lnfb, count
};
constexpr int kNumTensors = static_cast<int>(TensorId::count);

// How tensor parallelism treats a tensor.
enum class TpSplit { replicated, rows, cols };

struct TensorInfo {
  TensorId id;
  std::string name;             // llm.c's name ("qkvw")
  std::int64_t layers;          // 1 for non-layered tensors, n_layer for per-layer ones
  std::int64_t rows, cols;      // shape of one layer's slice (vectors: rows = length, cols = 1)
  std::int64_t offset;          // first element in the canonical flat array
  TpSplit split;
  std::int64_t parts;           // 3 for qkv (q, k, v), else 1
  bool weight_decay;            // matrices only; never LayerNorm or biases
  bool per_layer;               // one slice per transformer layer (llm.c's [L, ...] tensors)
  std::int64_t numel() const { return layers * rows * cols; }
};

struct BlockInfo {
  int id;
  TensorId tensor;
  std::int64_t layer;           // -1 for non-layered tensors
  std::int64_t row0, rows;      // tile within the layer's [rows x cols] slice
  std::int64_t col0, cols;
  std::int64_t part;            // q/k/v part for qkv, else 0
  std::int64_t unit;            // head-group index along the split axis, or -1 if replicated
  std::int64_t numel() const { return rows * cols; }
  std::int64_t bytes() const { return numel() * 4; }
};

class ParamCatalog {
 public:
  explicit ParamCatalog(const ModelShape& shape);

  const ModelShape& shape() const { return shape_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo& tensor(TensorId id) const { return tensors_[static_cast<int>(id)]; }
  const std::vector<BlockInfo>& blocks() const { return blocks_; }
  const BlockInfo& block(int id) const { return blocks_[id]; }
  std::int64_t total_numel() const { return total_numel_; }

  // Canonical flat index of element (r, c) of block b.
  std::int64_t canonical_index(const BlockInfo& b, std::int64_t r, std::int64_t c) const;
  // Copies a block between the canonical flat array and its packed form.
  void gather_block(const BlockInfo& b, const float* canonical, float* packed) const;
  void scatter_block(const BlockInfo& b, const float* packed, float* canonical) const;
  // Fills a packed block with its deterministic initial values (GPT-2 init, llm.c style):
  // weights N(0, init_std), residual projections N(0, init_std/sqrt(2 n_layer)),
  // LayerNorm weights 1, biases 0, padded vocabulary rows 0. Depends only on (seed, element).
  void init_block(const BlockInfo& b, double init_std, std::uint64_t seed, float* packed) const;
  // Human-readable block name for messages: "h.3.qkvw[k,head 2]".
  std::string block_name(const BlockInfo& b) const;
  // Where a forward first reads the block: 0 the embedding (wte, wpe), l + 1 layer l,
  // n_layer + 1 the final LayerNorm (the tied head reads wte again, already there).
  std::int64_t forward_need_rank(const BlockInfo& b) const;

 private:
  void add_tensor(TensorId id, const char* name, std::int64_t layers, std::int64_t rows,
                  std::int64_t cols, TpSplit split, std::int64_t parts, bool decay, bool per_layer);
  void cut_blocks(const TensorInfo& t);

  ModelShape shape_;
  std::vector<TensorInfo> tensors_;
  std::vector<BlockInfo> blocks_;
  std::int64_t total_numel_ = 0;
};

}  // namespace pdtrain
