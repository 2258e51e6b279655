#include "pdtrain/model/stage_params.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

namespace {
std::int64_t split_bound(std::int64_t n, std::int64_t k, std::int64_t i) { return n * i / k; }

bool tensor_on_stage(TensorId id, const TensorInfo& t, const StageSpec& s) {
  if (t.per_layer) return s.layer_end > s.layer_begin;
  switch (id) {
    case TensorId::wte: return s.has_embedding || s.has_head;  // tied: both ends use it
    case TensorId::wpe: return s.has_embedding;
    default: return s.has_head;                                // lnfw, lnfb
  }
}
}  // namespace

StageSpec split_stage(std::int64_t n_layer, int pp, int p, int tp, int t) {
  return StageSpec{p * n_layer / pp, (p + 1) * n_layer / pp, p == 0, p == pp - 1, tp, t};
}

StageParams::StageParams(const ParamCatalog& cat, const StageSpec& spec, Storage storage,
                         Precision precision, Device& device)
    : cat_(cat), spec_(spec), device_(device), precision_(precision) {
  const std::int64_t n_layers = spec.layer_end - spec.layer_begin;
  units_.resize(static_cast<std::size_t>(n_layers + 3));
  for (std::int64_t i = 0; i < n_layers; ++i)
    units_[i].name = "layer" + std::to_string(spec.layer_begin + i);
  units_[wte_unit()].name = "wte";
  units_[wpe_unit()].name = "wpe";
  units_[lnf_unit()].name = "lnf";
  const std::int64_t nh = cat.shape().n_head;
  for (const TensorInfo& t : cat.tensors()) {
    LocalTensor& lt = local_[static_cast<int>(t.id)];
    lt.present = tensor_on_stage(t.id, t, spec);
    if (!lt.present) continue;
    lt.layers = t.per_layer ? spec.layer_end - spec.layer_begin : 1;
    lt.unit_begin = spec.tp_rank * nh / spec.tp_size;
    lt.unit_end = (spec.tp_rank + 1) * nh / spec.tp_size;
    lt.rows = t.rows;
    lt.cols = t.cols;
    if (t.split == TpSplit::rows) {
      const std::int64_t part_rows = t.rows / t.parts;
      lt.rows = t.parts * (split_bound(part_rows, nh, lt.unit_end) -
                           split_bound(part_rows, nh, lt.unit_begin));
    } else if (t.split == TpSplit::cols) {
      lt.cols = split_bound(t.cols, nh, lt.unit_end) - split_bound(t.cols, nh, lt.unit_begin);
    }
    lt.offset = numel_;
    numel_ += lt.layers * lt.rows * lt.cols;
    // Within a unit, tensors follow catalogue order (a layer's tensors are all per-layer).
    Unit& u = units_[unit_of(t.id, spec.layer_begin)];
    lt.unit_offset = u.numel;
    u.numel += lt.rows * lt.cols;
  }
  for (std::int64_t i = 1; i < n_layers; ++i) units_[i].numel = units_[0].numel;
  for (const BlockInfo& b : cat.blocks())
    if (owns(b)) {
      needed_.push_back(b.id);
      units_[unit_of(b.tensor, b.layer)].blocks.push_back(b.id);
    }
  if (storage == Storage::shapes_only || storage == Storage::streamed) return;
  const AllocationLabel label(device_, "the stage's resident parameters and gradients (" +
                                           std::to_string(numel_) + " floats each" +
                                           (bf16() ? ", and the parameters' bf16 copy)" : ")"));
  grads_ = Mirrored<float>(device_, numel_);
  params_ = Mirrored<float>(device_, numel_);
  if (bf16()) params_bf16_ = Mirrored<pdtrain::bf16>(device_, numel_);
}

// A unit's storage: its fp32 values (numel floats), then their bf16 copies in bf16 precision.
const pdtrain::bf16* StageParams::param_bf16(TensorId id, std::int64_t layer) {
  PDT_CHECK(bf16(), "bf16 copy of a parameter asked for in fp32 precision");
  if (!params_.empty()) return params_bf16_.device() + where(id, layer);
  const int u = unit_of_param(id, layer);
  return reinterpret_cast<const pdtrain::bf16*>(units_[u].storage + units_[u].numel) +
         local_[static_cast<int>(id)].unit_offset;
}

pdtrain::bf16* StageParams::host_param_bf16(TensorId id, std::int64_t layer) {
  if (!params_.empty()) return params_bf16_.host() + where(id, layer);
  const int u = unit_of_param(id, layer);
  return reinterpret_cast<pdtrain::bf16*>(units_[u].staging + units_[u].numel) +
         local_[static_cast<int>(id)].unit_offset;
}

int StageParams::unit_of(TensorId id, std::int64_t layer) const {
  if (cat_.tensor(id).per_layer) return layer_unit(layer);
  switch (id) {
    case TensorId::wte: return wte_unit();
    case TensorId::wpe: return wpe_unit();
    default: return lnf_unit();
  }
}

void StageParams::bind_unit(int u, float* storage, float* staging) {
  units_[u].storage = storage;
  units_[u].staging = staging;
}

// The unit of tensor `id` at `layer`, checked to have memory bound: its parameters (a use the
// parameter cache was told of) or, `grads`, its gradients (a section the GradUser was told of).
int StageParams::bound_unit(TensorId id, std::int64_t layer, bool grads) const {
  const int u = unit_of(id, cat_.tensor(id).per_layer ? layer : spec_.layer_begin);
  const bool known = u >= 0 && u < num_units();
  PDT_CHECK(known && (grads ? units_[u].grad : units_[u].storage) != nullptr,
            (grads ? "gradients of unit " : "parameter unit ") +
                (known ? units_[u].name : std::string("?")) +
                (grads ? " written while not bound (a backward section the GradUser was not "
                         "told of)"
                       : " used while not resident (a use the parameter cache was not told of)"));
  return u;
}

int StageParams::unit_of_param(TensorId id, std::int64_t layer) const {
  return bound_unit(id, layer, false);
}

void StageParams::bind_unit_grads(int u, float* storage, float* host) {
  units_[u].grad = storage;
  units_[u].grad_host = host;
}

int StageParams::unit_of_grad(TensorId id, std::int64_t layer) const {
  return bound_unit(id, layer, true);
}

float* StageParams::grad(TensorId id, std::int64_t layer) {
  if (!grads_.empty()) return grads_.device() + where(id, layer);
  return units_[unit_of_grad(id, layer)].grad + local_[static_cast<int>(id)].unit_offset;
}

const float* StageParams::host_grad(TensorId id, std::int64_t layer) const {
  if (!grads_.empty()) return grads_.host() + where(id, layer);
  return units_[unit_of_grad(id, layer)].grad_host + local_[static_cast<int>(id)].unit_offset;
}

bool StageParams::unit_is_packed(int u, const std::vector<int>& blocks) const {
  std::int64_t next = 0;
  for (int id : blocks) {
    const BlockInfo& b = cat_.block(id);
    const LocalTensor& lt = local_[static_cast<int>(b.tensor)];
    std::int64_t r0, c0;
    block_origin(b, &r0, &c0);
    if (unit_of(b.tensor, b.layer) != u || c0 != 0 || b.cols != lt.cols ||
        lt.unit_offset + r0 * lt.cols != next)
      return false;
    next += b.numel();
  }
  return next == units_[u].numel;
}

float* StageParams::param(TensorId id, std::int64_t layer) {
  if (!params_.empty()) return params_.device() + where(id, layer);
  return units_[unit_of_param(id, layer)].storage + local_[static_cast<int>(id)].unit_offset;
}

float* StageParams::host_param(TensorId id, std::int64_t layer) {
  if (!params_.empty()) return params_.host() + where(id, layer);
  return units_[unit_of_param(id, layer)].staging + local_[static_cast<int>(id)].unit_offset;
}

bool StageParams::owns(const BlockInfo& b) const {
  const LocalTensor& lt = local_[static_cast<int>(b.tensor)];
  if (!lt.present) return false;
  if (b.layer >= 0 && (b.layer < spec_.layer_begin || b.layer >= spec_.layer_end)) return false;
  return b.unit < 0 || (b.unit >= lt.unit_begin && b.unit < lt.unit_end);
}

std::int64_t StageParams::where(TensorId id, std::int64_t layer) const {
  const LocalTensor& lt = local_[static_cast<int>(id)];
  PDT_CHECK(lt.present, "tensor not on this stage");
  const TensorInfo& t = cat_.tensor(id);
  const std::int64_t l = t.per_layer ? layer - spec_.layer_begin : 0;
  PDT_CHECK(l >= 0 && l < lt.layers, "layer not on this stage");
  return lt.offset + l * lt.rows * lt.cols;
}

void StageParams::block_origin(const BlockInfo& b, std::int64_t* row, std::int64_t* col) const {
  const TensorInfo& t = cat_.tensor(b.tensor);
  const LocalTensor& lt = local_[static_cast<int>(b.tensor)];
  const std::int64_t nh = cat_.shape().n_head;
  *row = b.row0;
  *col = b.col0;
  if (t.split == TpSplit::rows) {
    const std::int64_t part_rows = t.rows / t.parts;
    const std::int64_t local_part_rows = lt.rows / t.parts;
    const std::int64_t shard_first_row = split_bound(part_rows, nh, lt.unit_begin);
    *row = b.part * local_part_rows + (b.row0 - b.part * part_rows - shard_first_row);
  } else if (t.split == TpSplit::cols) {
    *col = b.col0 - split_bound(t.cols, nh, lt.unit_begin);
  }
}

void StageParams::unpack_param(const BlockInfo& b, const float* packed) {
  std::int64_t r0, c0;
  block_origin(b, &r0, &c0);
  const std::int64_t ld = local_[static_cast<int>(b.tensor)].cols;
  float* base = host_param(b.tensor, b.layer);
  if (!bf16()) {
    for (std::int64_t r = 0; r < b.rows; ++r)
      std::copy_n(packed + r * b.cols, b.cols, base + (r0 + r) * ld + c0);
    return;
  }
  // bf16 precision: the values rounded to bf16 (idempotent on blocks that came as bf16), and
  // their bf16 copy, in one pass.
  pdtrain::bf16* base_h = host_param_bf16(b.tensor, b.layer);
  for (std::int64_t r = 0; r < b.rows; ++r) {
    const float* in = packed + r * b.cols;
    float* out = base + (r0 + r) * ld + c0;
    pdtrain::bf16* out_h = base_h + (r0 + r) * ld + c0;
    for (std::int64_t c = 0; c < b.cols; ++c) {
      out_h[c] = to_bf16(in[c]);
      out[c] = to_float(out_h[c]);
    }
  }
}

BlockPlace StageParams::block_place(const BlockInfo& b, int elem_bytes) {
  if (elem_bytes != 4 && !(elem_bytes == 2 && bf16())) return {};
  char* tensor = elem_bytes == 4 ? reinterpret_cast<char*>(host_param(b.tensor, b.layer))
                                 : reinterpret_cast<char*>(host_param_bf16(b.tensor, b.layer));
  return place_in(b, tensor, elem_bytes);
}

void StageParams::finish_landed_rows(const BlockInfo& b, int elem_bytes, std::int64_t row_begin,
                                     std::int64_t row_end) {
  if (!bf16()) return;  // fp32 values landed where they belong
  std::int64_t r0, c0;
  block_origin(b, &r0, &c0);
  const std::int64_t ld = local_[static_cast<int>(b.tensor)].cols;
  float* base = host_param(b.tensor, b.layer) + r0 * ld + c0;
  pdtrain::bf16* base_h = host_param_bf16(b.tensor, b.layer) + r0 * ld + c0;
  for (std::int64_t r = row_begin; r < row_end; ++r) {
    float* out = base + r * ld;
    pdtrain::bf16* out_h = base_h + r * ld;
    if (elem_bytes == 2) {
      for (std::int64_t c = 0; c < b.cols; ++c) out[c] = to_float(out_h[c]);
    } else {
      for (std::int64_t c = 0; c < b.cols; ++c) {
        out_h[c] = to_bf16(out[c]);
        out[c] = to_float(out_h[c]);
      }
    }
  }
}

void StageParams::upload_params() {
  params_.upload();
  if (bf16()) params_bf16_.upload();
}

void StageParams::download_grads() {
  grads_.download();
  device_.synchronize();
}

void StageParams::pack_grad(const BlockInfo& b, float* packed) const {
  pack_rows(grad_place(b), reinterpret_cast<char*>(packed));
}

template <class Byte>
BasicBlockPlace<Byte> StageParams::place_in(const BlockInfo& b, Byte* tensor,
                                            int elem_bytes) const {
  std::int64_t r0, c0;
  block_origin(b, &r0, &c0);
  const std::int64_t ld = local_[static_cast<int>(b.tensor)].cols;
  return BasicBlockPlace<Byte>{tensor + (r0 * ld + c0) * elem_bytes, b.rows, b.cols * elem_bytes,
                               ld * elem_bytes};
}

ConstBlockPlace StageParams::grad_place(const BlockInfo& b) const {
  return place_in(b, reinterpret_cast<const char*>(host_grad(b.tensor, b.layer)), 4);
}

ConstBlockPlace StageParams::grad_place(const BlockInfo& b, const float* unit_grads) const {
  const float* tensor = unit_grads + local_[static_cast<int>(b.tensor)].unit_offset;
  return place_in(b, reinterpret_cast<const char*>(tensor), 4);
}

std::vector<kernels::KernelOps::Tile> StageParams::tiles(const std::vector<int>& blocks) const {
  std::vector<kernels::KernelOps::Tile> out;
  for (int id : blocks) {
    const BlockInfo& b = cat_.block(id);
    std::int64_t r0, c0;
    block_origin(b, &r0, &c0);
    const std::int64_t ld = local_[static_cast<int>(b.tensor)].cols;
    out.push_back({where(b.tensor, b.layer) + r0 * ld + c0, b.rows, b.cols, ld});
  }
  return out;
}

std::int64_t StageParams::vocab_begin() const {
  const LocalTensor& lt = local_[static_cast<int>(TensorId::wte)];
  return split_bound(cat_.shape().padded_vocab, cat_.shape().n_head, lt.unit_begin);
}

std::int64_t StageParams::vocab_end() const {
  const LocalTensor& lt = local_[static_cast<int>(TensorId::wte)];
  return split_bound(cat_.shape().padded_vocab, cat_.shape().n_head, lt.unit_end);
}

void StageParams::zero_grads() {
  if (grads_.empty()) return;  // streamed: zeroed when bound
  device_.zero(grads_.device(), static_cast<std::size_t>(numel_) * sizeof(float));
}

}  // namespace pdtrain
