#pragma once
// The replicated baseline (parallel.holders = 0, Megatron/DDP style): this rank keeps the blocks
// of its stage shard (every block with one stage and no tensor parallelism), their AdamW state
// and the step's reduced gradients on its own device (a GPU's memory, or the host on the CPU),
// packed block after block as holders keep them, and applies AdamW there with the holders'
// arithmetic (adamw_math.hpp): the same gradient gives the same bits on any device, so the
// baseline and PD with CPU holders are bit-identical.
//
// With tensor or pipeline parallelism one data-parallel replica of the model is spread over
// its pp x tp ranks (ReplicaShard): each block is *counted* by exactly one of them (the tied
// embedding by the first stage, a block replicated over the tensor-parallel group by tp rank
// 0). The global gradient norm adds the counted blocks' sums of squares in block order over
// the whole replica, as the holders add theirs, so the clip is theirs; checkpoints, samples,
// trajectories and the final canonical CRC take each block from the rank that counts it.
//
// Two ways in: the ParameterService calls, with host data (fetch downloads, push uploads), and
// the device path the step loop uses (params(), grads(), update()), which keeps the whole
// optimizer step on the device.
#include <mpi.h>

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

// Which part of one replica of the model this rank keeps, and who it shares the replica with.
// The default is the data-parallel baseline: every block, alone.
struct ReplicaShard {
  std::vector<int> kept;     // blocks kept here, in block order (empty: every block)
  std::vector<int> counted;  // of them, those this rank stands for (empty: every kept block)
  // The replica's ranks (pp x tp of one data-parallel index): collective over it are the
  // update's norm and the final CRC. MPI_COMM_SELF: this rank is the whole replica.
  MPI_Comm replica = MPI_COMM_SELF;
  // The rank of `replica` that gets the final canonical CRC (the reporter's); -1: none does,
  // and the replica computes none (data-parallel replicas other than 0).
  int crc_root = 0;
};

class DeviceReplica final : public ParameterService {
 public:
  DeviceReplica(const BlockTable& table, const AdamWConfig& opt, Device& device,
                kernels::KernelOps& ops, ReplicaShard shard = {});

  // ParameterService, host side.
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish_and_checksum() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  std::int64_t bytes_fetched() const override { return 0; }
  std::int64_t bytes_pushed() const override { return 0; }

  // The blocks kept here, in block order: the host and device layouts pack them in this order.
  const std::vector<int>& kept_blocks() const { return kept_; }

  // Device side: every kept block packed in block order (offset(b) floats in).
  std::int64_t version() const { return last_.version; }
  std::int64_t offset(int block) const { return offsets_[slot(block)]; }
  std::int64_t numel() const { return offsets_.back(); }
  const float* params() const { return params_.device(); }
  float* grads() { return grads_.device(); }
  // The host view of grads() for the gradients of a few kept blocks completed on the host (the
  // tied embedding, tensor-replicated blocks): download_grads() makes `blocks`' host copies
  // valid (synchronizing), upload_grads() queues them back to the device.
  float* grads_host() { return grads_.host(); }
  void download_grads(const std::vector<int>& blocks);
  void upload_grads(const std::vector<int>& blocks);
  // AdamW of 1-based step `step` from the reduced gradients at `device_grads` (packed like
  // params(); usually grads()): the global norm from per-block sums of squares, clipping, the
  // update, then the hooks. Collective over the replica: a loss divergence marked on any of
  // its ranks (mark_diverged) keeps every one of them from applying the step.
  UpdateInfo update(std::int64_t step, const float* device_grads);

  // Why training diverged (its gradient norm was not finite), "" if it did not.
  const std::string& divergence() const { return divergence_; }

  // The same checkpoint hooks as a holder's (after each update, at the end).
  void set_hooks(HolderHooks hooks) { hooks_ = std::move(hooks); }
  // Every kept block's state (from a checkpoint).
  void restore(std::int64_t version, std::map<int, BlockState> blocks);
  // Host copies of the counted blocks' state (copied from the device when asked): what this
  // rank writes to checkpoints.
  HolderHooks::OwnedBlocks owned_blocks() const;

 private:
  // Consecutive blocks that share a weight-decay flag: one AdamW call each.
  struct DecayRun {
    int first = 0, last = 0;  // [first, last)
    bool decay = false;
  };

  int slot(int block) const;  // its place among the kept blocks
  // The counted blocks' sums of squares, added over the replica into block order (every
  // block of the model, 0 for none), and whether any rank of the replica marked `step`'s loss
  // diverged.
  std::vector<double> replica_sums_of_squares(std::int64_t step, const double* kept_sumsq,
                                              bool* loss_diverged) const;
  std::uint32_t canonical_crc() const;

  const BlockTable& table_;
  AdamWConfig opt_;
  Device& device_;
  kernels::KernelOps& ops_;
  std::vector<int> kept_;                 // block of each slot
  std::vector<bool> counted_;             // per slot
  std::vector<int> slot_of_;              // per block of the model: its slot, or -1
  MPI_Comm replica_;
  int crc_root_;
  std::vector<std::int64_t> offsets_;  // slot i at [offsets_[i], offsets_[i+1])
  std::vector<kernels::Index> sizes_;
  std::vector<DecayRun> runs_;         // over slots
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
