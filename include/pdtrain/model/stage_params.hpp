#pragma once
// The parameters one compute rank works on: its pipeline stage's layers (plus the embedding on
// the first stage and the final LayerNorm/head on the last) and its tensor-parallel shard of
// each. Gradients live in one flat buffer for the whole step; blocks fetched from the holders
// are unpacked into place, gradients are packed back into blocks for pushing.
//
// Parameters are grouped into residency units, the sets of tensors the model uses together:
// one unit per layer, and wte, wpe and the final LayerNorm. With Storage::resident every unit
// lives in one flat buffer laid out like the gradients (the whole stage at once). With
// Storage::streamed a parameter cache binds each unit to memory only while it is resident, and
// the model announces each use with need(), so a rank can hold a few layers at a time.
//
// Memory: parameters and gradients live on the rank's Device (a GPU's memory, or host memory
// on the CPU). Blocks are unpacked on the host, into a unit's host staging (pinned on a GPU;
// the storage itself on the CPU), and uploaded from there; gradients are downloaded once per
// step and packed from the host view. On the CPU the uploads and downloads are no-ops.
#include <cstdint>
#include <string>
#include <vector>

#include "pdtrain/core/bf16.hpp"
#include "pdtrain/core/block_place.hpp"
#include "pdtrain/core/run_modes.hpp"
#include "pdtrain/device/device.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/model/catalog.hpp"

namespace pdtrain {

struct StageSpec {
  std::int64_t layer_begin = 0, layer_end = 0;  // [begin, end) of transformer layers
  bool has_embedding = true;                    // wte + wpe lookup (first stage)
  bool has_head = true;                         // final LayerNorm + tied LM head (last stage)
  std::int64_t tp_size = 1, tp_rank = 0;
};

// Pipeline stage p of pp over n_layer transformer layers, its tensor rank t of tp: layers
// [p n_layer / pp, (p + 1) n_layer / pp), the embedding on the first stage, the head on the
// last. The one split training (app's stage_spec) and `pdtrain plan` use.
StageSpec split_stage(std::int64_t n_layer, int pp, int p, int tp, int t);

// Told by the model before each use of a set of units (see StageProgram::forward_uses()).
class UnitUser {
 public:
  virtual ~UnitUser() = default;
  virtual void need(const std::vector<int>& units) = 0;
};

// Told by the model around each backward section that adds into units' gradients (see
// StageProgram::backward_grad_uses()): before, so their gradient memory can be bound (and zeroed) when
// a step first writes it; after, so a unit whose last write of the step is done can be reduced
// and pushed while backward goes on (Storage::streamed).
class GradUser {
 public:
  virtual ~GradUser() = default;
  virtual void grads_begin(const std::vector<int>& units) = 0;
  virtual void grads_end(const std::vector<int>& units) = 0;
};

class StageParams {
 public:
  enum class Storage {
    shapes_only,  // the shard's blocks and sizes only (for --dry-run)
    resident,     // every parameter in one buffer
    streamed,     // units bound by a cache (bind_unit), and their gradients by a GradUser
                  // (bind_unit_grads) only while a step writes and pushes them
  };
  StageParams(const ParamCatalog& cat, const StageSpec& spec, Storage storage = Storage::resident,
              Precision precision = Precision::fp32, Device& device = cpu_device());
  bool bf16() const { return precision_ == Precision::bf16; }

  const StageSpec& spec() const { return spec_; }
  const ParamCatalog& catalog() const { return cat_; }
  // Blocks this rank reads, in catalogue order.
  const std::vector<int>& needed_blocks() const { return needed_; }
  std::int64_t numel() const { return numel_; }

  Device& device() const { return device_; }
  // Local tensor of `id` for global layer `layer` (ignored for non-layered tensors), in device
  // memory. A param's unit must be resident.
  float* param(TensorId id, std::int64_t layer = 0);
  float* grad(TensorId id, std::int64_t layer = 0);
  // bf16 precision: the bf16 copy of a parameter (same layout as param()).
  const pdtrain::bf16* param_bf16(TensorId id, std::int64_t layer = 0);
  // Storage::resident, host view: same layout as grads().
  float* params_host() { return params_.host(); }
  float* grads_host() { return grads_.host(); }

  // Residency units: layers first (unit i = the stage's i-th layer), then wte, wpe, lnf.
  int num_units() const { return static_cast<int>(units_.size()); }
  int layer_unit(std::int64_t layer) const { return static_cast<int>(layer - spec_.layer_begin); }
  int wte_unit() const { return num_units() - 3; }
  int wpe_unit() const { return num_units() - 2; }
  int lnf_unit() const { return num_units() - 1; }
  std::int64_t unit_numel(int u) const { return units_[u].numel; }
  // Floats of storage a unit needs: its parameters, plus their bf16 copies in bf16 precision.
  std::int64_t unit_storage(int u) const {
    return units_[u].numel + (bf16() ? (units_[u].numel + 1) / 2 : 0);
  }
  const std::vector<int>& unit_blocks(int u) const { return units_[u].blocks; }  // needed ones
  const std::string& unit_name(int u) const { return units_[u].name; }
  // Streamed storage: gives unit u the device memory at `storage` (unit_storage floats) and
  // its host staging (the same pointer on the CPU), or takes them away (nullptr). Blocks of the
  // unit are unpacked into the staging; the cache uploads it.
  void bind_unit(int u, float* storage, float* staging);
  bool resident(int u) const { return units_[u].storage != nullptr; }
  // The model calls need() before using a set of units; a cache (the UnitUser) makes them
  // resident. Without a user every unit already is.
  void set_unit_user(UnitUser* user) { user_ = user; }
  void need(const std::vector<int>& units) {
    if (user_) user_->need(units);
  }
  // Streamed storage: gives unit u's gradients device memory (unit_numel floats, laid out like
  // the unit's parameters) and its host view for packing (the same pointer on the CPU), or
  // takes them away (nullptr). The model announces its gradient writes to the GradUser.
  void bind_unit_grads(int u, float* storage, float* host);
  bool grads_resident(int u) const { return units_[u].grad != nullptr; }
  void set_grad_user(GradUser* user) { grad_user_ = user; }
  void grads_begin(const std::vector<int>& units) {
    if (grad_user_) grad_user_->grads_begin(units);
  }
  void grads_end(const std::vector<int>& units) {
    if (grad_user_) grad_user_->grads_end(units);
  }
  // Whether `blocks` of unit u, packed back to back in this order, are exactly the unit's
  // storage (every block whole rows, in storage order, covering it): then its gradients can be
  // pushed from where they are, without packing.
  bool unit_is_packed(int u, const std::vector<int>& blocks) const;
  // Local rows/cols of one layer's slice of `id` on this rank.
  std::int64_t local_rows(TensorId id) const { return local_[static_cast<int>(id)].rows; }
  std::int64_t local_cols(TensorId id) const { return local_[static_cast<int>(id)].cols; }

  // Rows of wte (the vocabulary shard) this rank holds: [vocab_begin, vocab_end).
  std::int64_t vocab_begin() const;
  std::int64_t vocab_end() const;
  // Whether this rank pushes the gradient of block b: blocks replicated across the
  // tensor-parallel group have identical gradients on every member; only tp rank 0 pushes.
  bool pushes(const BlockInfo& b) const { return b.unit >= 0 || spec_.tp_rank == 0; }

  // Writes block b's values into the host view of its parameters (the resident buffer's, or
  // its unit's staging); in bf16 precision, rounded, with their bf16 copy.
  void unpack_param(const BlockInfo& b, const float* packed);
  // Receiving in place instead: where block b's wire payload of `elem_bytes` per element can
  // land so that it is where unpack_param would put it (its tile of the host view: fp32 values
  // for 4-byte elements; in bf16 precision the bf16 copy for 2-byte ones). A row-parallel
  // weight's block is a column slab, so its rows are apart. No place (fp32 precision, bf16
  // wire): unpack_param it is.
  BlockPlace block_place(const BlockInfo& b, int elem_bytes);
  // Rows [row_begin, row_end) of a block that landed at block_place: in bf16 precision, the
  // fp32 values rounded with their bf16 copy (4-byte wire), or widened from it (2-byte wire).
  void finish_landed_rows(const BlockInfo& b, int elem_bytes, std::int64_t row_begin,
                          std::int64_t row_end);
  // Storage::resident: the unpacked parameters to the device (queued on the compute queue).
  void upload_params();
  // Resident storage: the gradients to the host view (then synchronizes), for pack_grad.
  void download_grads();
  // Block b's gradient from the host view (the whole buffer's, or its unit's), packed
  // row-major.
  void pack_grad(const BlockInfo& b, float* packed) const;
  // Block b's gradient where it lies in the host view (fp32).
  ConstBlockPlace grad_place(const BlockInfo& b) const;
  // The same in a unit's gradient laid out like its storage at `unit_grads` (streamed gradients
  // no longer bound, on their way to the holders).
  ConstBlockPlace grad_place(const BlockInfo& b, const float* unit_grads) const;
  // The unit a block belongs to.
  int unit_of_block(const BlockInfo& b) const { return unit_of(b.tensor, b.layer); }
  // Where blocks live in the resident parameter buffer and in the gradient buffer (both have
  // this layout), for device kernels that pack and unpack them (KernelOps::gather_tiles).
  std::vector<kernels::KernelOps::Tile> tiles(const std::vector<int>& blocks) const;
  // Storage::resident, device memory: every parameter, and its bf16 copy (null in fp32).
  float* params_device() { return params_.device(); }
  float* grads_device() { return grads_.device(); }
  pdtrain::bf16* params_bf16_device() { return bf16() ? params_bf16_.device() : nullptr; }
  // Resident storage: zero the gradients (streamed gradients are zeroed when bound).
  void zero_grads();

 private:
  struct LocalTensor {
    bool present = false;
    std::int64_t layers = 0, rows = 0, cols = 0, offset = 0;
    std::int64_t unit_begin = 0, unit_end = 0;  // head units of this tp shard
    std::int64_t unit_offset = 0;               // within its residency unit's storage
  };
  struct Unit {
    std::string name;
    std::int64_t numel = 0;
    std::vector<int> blocks;
    float* storage = nullptr;  // device memory
    float* staging = nullptr;  // its host view
    float* grad = nullptr;       // streamed gradients: device memory
    float* grad_host = nullptr;  // ... and its host view
  };
  std::int64_t where(TensorId id, std::int64_t layer) const;
  int unit_of(TensorId id, std::int64_t layer) const;
  int bound_unit(TensorId id, std::int64_t layer, bool grads) const;
  int unit_of_param(TensorId id, std::int64_t layer) const;  // checked to be resident
  int unit_of_grad(TensorId id, std::int64_t layer) const;   // checked to be bound
  const float* host_grad(TensorId id, std::int64_t layer) const;
  // Block b's place in `tensor`, the local tensor (one layer's slice) it belongs to, elements of
  // `elem_bytes`.
  template <class Byte>
  BasicBlockPlace<Byte> place_in(const BlockInfo& b, Byte* tensor, int elem_bytes) const;
  // The host view of a parameter and of its bf16 copy (where unpack_param writes).
  float* host_param(TensorId id, std::int64_t layer);
  pdtrain::bf16* host_param_bf16(TensorId id, std::int64_t layer);
  // Local (row, col) of the block's first element and the local row stride.
  void block_origin(const BlockInfo& b, std::int64_t* row, std::int64_t* col) const;
  bool owns(const BlockInfo& b) const;

  const ParamCatalog& cat_;
  StageSpec spec_;
  LocalTensor local_[kNumTensors];
  std::vector<int> needed_;
  std::int64_t numel_ = 0;
  Device& device_;
  Mirrored<float> params_, grads_;
  Mirrored<pdtrain::bf16> params_bf16_;  // resident storage, bf16 precision
  Precision precision_ = Precision::fp32;
  std::vector<Unit> units_;
  UnitUser* user_ = nullptr;
  GradUser* grad_user_ = nullptr;
};

}  // namespace pdtrain
