#pragma once
// The replicated data-parallel baseline (parallel.holders = 0): this rank keeps every block,
// its AdamW state and the step's reduced gradients on its own device (a GPU's memory, or the
// host on the CPU), packed block after block as holders keep them, and applies AdamW there
// with the holders' arithmetic (adamw_math.hpp): the same gradient gives the same bits on any
// device, so the baseline and PD with CPU holders are bit-identical.
//
// Two ways in: the ParameterService calls, with host data (fetch downloads, push uploads), and
// the device path the step loop uses (params(), grads(), update()), which keeps the whole
// optimizer step on the device.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pdtrain/device/device.hpp"
#include "pdtrain/kernels/kernel_ops.hpp"
#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/parameter_service.hpp"
#include "pdtrain/pd/holder_server.hpp"

namespace pdtrain {

class DeviceReplica final : public ParameterService {
 public:
  DeviceReplica(const BlockTable& table, const AdamWConfig& opt, Device& device,
                kernels::KernelOps& ops);

  // ParameterService, host side.
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish_and_checksum() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  std::int64_t bytes_fetched() const override { return 0; }
  std::int64_t bytes_pushed() const override { return 0; }

  // Device side: every block packed in block order (offset(b) floats in).
  std::int64_t version() const { return last_.version; }
  std::int64_t offset(int block) const { return offsets_[block]; }
  std::int64_t numel() const { return offsets_.back(); }
  const float* params() const { return params_.device(); }
  float* grads() { return grads_.device(); }
  // AdamW of 1-based step `step` from the reduced gradients at `device_grads` (packed like
  // params(); usually grads()): the global norm from per-block sums of squares, clipping, the
  // update, then the hooks.
  UpdateInfo update(std::int64_t step, const float* device_grads);

  // Why training diverged (its gradient norm was not finite), "" if it did not.
  const std::string& divergence() const { return divergence_; }

  // The same checkpoint hooks as a holder's (after each update, at the end).
  void set_hooks(HolderHooks hooks) { hooks_ = std::move(hooks); }
  void restore(std::int64_t version, std::map<int, BlockState> blocks);
  // Host copies of every block's state (copied from the device when asked).
  HolderHooks::OwnedBlocks owned_blocks() const;

 private:
  // Consecutive blocks that share a weight-decay flag: one AdamW call each.
  struct DecayRun {
    int first = 0, last = 0;  // [first, last)
    bool decay = false;
  };

  const BlockTable& table_;
  AdamWConfig opt_;
  Device& device_;
  kernels::KernelOps& ops_;
  std::vector<std::int64_t> offsets_;  // block b at [offsets_[b], offsets_[b+1])
  std::vector<kernels::Index> sizes_;
  std::vector<DecayRun> runs_;
  mutable Mirrored<float> params_, m_, v_;
  Mirrored<float> grads_;
  Mirrored<double> sumsq_;
  mutable std::vector<BlockState> host_;  // owned_blocks()'s copies
  bool diverged(std::int64_t step, double norm, const std::vector<double>& by_block);

  UpdateInfo last_;
  std::map<std::int64_t, UpdateInfo> history_{{0, UpdateInfo{}}};  // by version
  std::int64_t diverged_at_ = 0;  // the first update not applied (its norm was not finite)
  std::string divergence_;
  HolderHooks hooks_;
};

}  // namespace pdtrain
