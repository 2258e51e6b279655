#include "pdtrain/model/catalog.hpp"

#include <cmath>

#include "pdtrain/core/rng.hpp"

namespace pdtrain {

ModelShape resolve_model_shape(const ModelConfig& m) {
  ModelShape s{};
  s.n_layer = m.n_layer;
  s.n_head = m.n_head;
  s.d_model = m.d_model;
  s.vocab_size = m.vocab_size;
  // llm.c pads the vocabulary to a multiple of 128 for aligned GEMMs.
  s.padded_vocab = m.padded_vocab_size > 0 ? m.padded_vocab_size : (m.vocab_size + 127) / 128 * 128;
  s.seq_len = m.seq_len;
  s.max_seq_len = m.max_seq_len > 0 ? m.max_seq_len : m.seq_len;
  return s;
}

ParamCatalog::ParamCatalog(const ModelShape& s) : shape_(s) {
  const std::int64_t C = s.d_model, L = s.n_layer;
  using T = TensorId;
  add_tensor(T::wte, "wte", 1, s.padded_vocab, C, TpSplit::rows, 1, true, false);  // vocab-parallel
  add_tensor(T::wpe, "wpe", 1, s.max_seq_len, C, TpSplit::replicated, 1, true, false);
  add_tensor(T::ln1w, "ln1w", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::ln1b, "ln1b", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::qkvw, "qkvw", L, 3 * C, C, TpSplit::rows, 3, true, true);
  add_tensor(T::qkvb, "qkvb", L, 3 * C, 1, TpSplit::rows, 3, false, true);
  add_tensor(T::attprojw, "attprojw", L, C, C, TpSplit::cols, 1, true, true);
  add_tensor(T::attprojb, "attprojb", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::ln2w, "ln2w", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::ln2b, "ln2b", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::fcw, "fcw", L, 4 * C, C, TpSplit::rows, 1, true, true);
  add_tensor(T::fcb, "fcb", L, 4 * C, 1, TpSplit::rows, 1, false, true);
  add_tensor(T::fcprojw, "fcprojw", L, C, 4 * C, TpSplit::cols, 1, true, true);
  add_tensor(T::fcprojb, "fcprojb", L, C, 1, TpSplit::replicated, 1, false, true);
  add_tensor(T::lnfw, "lnfw", 1, C, 1, TpSplit::replicated, 1, false, false);
  add_tensor(T::lnfb, "lnfb", 1, C, 1, TpSplit::replicated, 1, false, false);
  for (const auto& t : tensors_) cut_blocks(t);
}

void ParamCatalog::add_tensor(TensorId id, const char* name, std::int64_t layers,
                              std::int64_t rows, std::int64_t cols, TpSplit split,
                              std::int64_t parts, bool decay, bool per_layer) {
  TensorInfo t{id, name, layers, rows, cols, total_numel_, split, parts, decay, per_layer};
  total_numel_ += t.numel();
  tensors_.push_back(t);
}

// Splits [0, n) into k nearly equal ranges; range i is [bound(i), bound(i+1)).
static std::int64_t split_bound(std::int64_t n, std::int64_t k, std::int64_t i) { return n * i / k; }

void ParamCatalog::cut_blocks(const TensorInfo& t) {
  const std::int64_t units = shape_.n_head;
  for (std::int64_t l = 0; l < t.layers; ++l) {
    const std::int64_t layer = t.per_layer ? l : -1;
    auto add = [&](std::int64_t r0, std::int64_t nr, std::int64_t c0, std::int64_t nc,
                   std::int64_t part, std::int64_t unit) {
      blocks_.push_back(BlockInfo{static_cast<int>(blocks_.size()), t.id, layer, r0, nr, c0, nc,
                                  part, unit});
    };
    if (t.split == TpSplit::rows) {
      const std::int64_t part_rows = t.rows / t.parts;
      for (std::int64_t p = 0; p < t.parts; ++p)
        for (std::int64_t u = 0; u < units; ++u) {
          const std::int64_t r0 = split_bound(part_rows, units, u);
          add(p * part_rows + r0, split_bound(part_rows, units, u + 1) - r0, 0, t.cols, p, u);
        }
    } else if (t.split == TpSplit::cols) {
      for (std::int64_t u = 0; u < units; ++u) {
        const std::int64_t c0 = split_bound(t.cols, units, u);
        add(0, t.rows, c0, split_bound(t.cols, units, u + 1) - c0, 0, u);
      }
    } else if (t.id == TensorId::wpe) {
      // The position table is replicated but large: row chunks keep any one block small.
      for (std::int64_t u = 0; u < units; ++u) {
        const std::int64_t r0 = split_bound(t.rows, units, u);
        add(r0, split_bound(t.rows, units, u + 1) - r0, 0, t.cols, 0, -1);
      }
    } else {
      add(0, t.rows, 0, t.cols, 0, -1);
    }
  }
}

std::int64_t ParamCatalog::canonical_index(const BlockInfo& b, std::int64_t r,
                                           std::int64_t c) const {
  const TensorInfo& t = tensor(b.tensor);
  const std::int64_t layer_base = (b.layer < 0 ? 0 : b.layer) * t.rows * t.cols;
  return t.offset + layer_base + (b.row0 + r) * t.cols + (b.col0 + c);
}

void ParamCatalog::gather_block(const BlockInfo& b, const float* canonical, float* packed) const {
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const float* src = canonical + canonical_index(b, r, 0);
    for (std::int64_t c = 0; c < b.cols; ++c) packed[r * b.cols + c] = src[c];
  }
}

void ParamCatalog::scatter_block(const BlockInfo& b, const float* packed, float* canonical) const {
  for (std::int64_t r = 0; r < b.rows; ++r) {
    float* dst = canonical + canonical_index(b, r, 0);
    for (std::int64_t c = 0; c < b.cols; ++c) dst[c] = packed[r * b.cols + c];
  }
}

void ParamCatalog::init_block(const BlockInfo& b, double init_std, std::uint64_t seed,
                              float* packed) const {
  const TensorInfo& t = tensor(b.tensor);
  const bool ln_weight = b.tensor == TensorId::ln1w || b.tensor == TensorId::ln2w ||
                         b.tensor == TensorId::lnfw;
  const bool residual_proj = b.tensor == TensorId::attprojw || b.tensor == TensorId::fcprojw;
  const double std_dev =
      residual_proj ? init_std / std::sqrt(2.0 * static_cast<double>(shape_.n_layer)) : init_std;
  const std::uint64_t key = rng_key(seed, 0x1417 /* "init" */);
  for (std::int64_t r = 0; r < b.rows; ++r)
    for (std::int64_t c = 0; c < b.cols; ++c) {
      float v = 0.0f;
      if (ln_weight) {
        v = 1.0f;
      } else if (t.weight_decay) {  // a matrix
        const bool padded_row = b.tensor == TensorId::wte && b.row0 + r >= shape_.vocab_size;
        const auto idx = static_cast<std::uint64_t>(canonical_index(b, r, c));
        v = padded_row ? 0.0f : static_cast<float>(std_dev * rng_normal(key, idx));
      }
      packed[r * b.cols + c] = v;
    }
}

std::int64_t ParamCatalog::forward_need_rank(const BlockInfo& b) const {
  if (b.layer >= 0) return b.layer + 1;
  return b.tensor == TensorId::lnfw || b.tensor == TensorId::lnfb ? shape_.n_layer + 1 : 0;
}

std::string ParamCatalog::block_name(const BlockInfo& b) const {
  const TensorInfo& t = tensor(b.tensor);
  std::string s = b.layer >= 0 ? "h." + std::to_string(b.layer) + "." + t.name : t.name;
  s += "[rows " + std::to_string(b.row0) + ".." + std::to_string(b.row0 + b.rows);
  if (t.cols > 1) s += ", cols " + std::to_string(b.col0) + ".." + std::to_string(b.col0 + b.cols);
  s += "]";
  return s;
}

}  // namespace pdtrain
