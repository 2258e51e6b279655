#pragma once
// The parameters one compute rank works on: its pipeline stage's layers (plus the embedding on
// the first stage and the final LayerNorm/head on the last) and its tensor-parallel shard of
// each. Local tensors live in one flat buffer (and a mirror for gradients); blocks fetched from
// the holders are unpacked into place, gradients are packed back into blocks for pushing.
#include <cstdint>
#include <vector>

#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

struct StageSpec {
  std::int64_t layer_begin = 0, layer_end = 0;  // [begin, end) of transformer layers
  bool has_embedding = true;                    // wte + wpe lookup (first stage)
  bool has_head = true;                         // final LayerNorm + tied LM head (last stage)
  std::int64_t tp_size = 1, tp_rank = 0;
};

class StageParams {
 public:
  // `allocate = false` computes the shard's blocks and sizes only (for --dry-run).
  StageParams(const ParamCatalog& cat, const StageSpec& spec, bool allocate = true);

  const StageSpec& spec() const { return spec_; }
  const ParamCatalog& catalog() const { return cat_; }
  // Blocks this rank reads, in catalogue order.
  const std::vector<int>& needed_blocks() const { return needed_; }
  std::int64_t numel() const { return numel_; }

  // Local tensor of `id` for global layer `layer` (ignored for non-layered tensors).
  float* param(TensorId id, std::int64_t layer = 0) { return params_.data() + where(id, layer); }
  float* grad(TensorId id, std::int64_t layer = 0) { return grads_.data() + where(id, layer); }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  // Local rows/cols of one layer's slice of `id` on this rank.
  std::int64_t local_rows(TensorId id) const { return local_[static_cast<int>(id)].rows; }
  std::int64_t local_cols(TensorId id) const { return local_[static_cast<int>(id)].cols; }

  // Rows of wte (the vocabulary shard) this rank holds: [vocab_begin, vocab_end).
  std::int64_t vocab_begin() const;
  std::int64_t vocab_end() const;
  // Whether this rank pushes the gradient of block b: blocks replicated across the
  // tensor-parallel group have identical gradients on every member; only tp rank 0 pushes.
  bool pushes(const BlockInfo& b) const { return b.unit >= 0 || spec_.tp_rank == 0; }

  void unpack_param(const BlockInfo& b, const float* packed);
  void pack_grad(const BlockInfo& b, float* packed) const;
  void zero_grads();

 private:
  struct LocalTensor {
    bool present = false;
    std::int64_t layers = 0, rows = 0, cols = 0, offset = 0;
    std::int64_t unit_begin = 0, unit_end = 0;  // head units of this tp shard
  };
  std::int64_t where(TensorId id, std::int64_t layer) const;
  // Local (row, col) of the block's first element and the local row stride.
  void block_origin(const BlockInfo& b, std::int64_t* row, std::int64_t* col) const;
  bool owns(const BlockInfo& b) const;

  const ParamCatalog& cat_;
  StageSpec spec_;
  LocalTensor local_[kNumTensors];
  std::vector<int> needed_;
  std::int64_t numel_ = 0;
  std::vector<float> params_, grads_;
};

}  // namespace pdtrain
