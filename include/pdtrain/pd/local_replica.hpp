#pragma once
// The replicated data-parallel baseline (parallel.holders = 0): this rank keeps every block
// and its AdamW state and applies the (already all-reduced) gradients itself, with exactly
// the arithmetic the holders use.
#include <vector>

#include "pdtrain/optim/adamw.hpp"
#include "pdtrain/pd/blocks.hpp"
#include "pdtrain/pd/holder_server.hpp"
#include "pdtrain/pd/parameter_service.hpp"

namespace pdtrain {

class LocalReplica final : public ParameterService {
 public:
  LocalReplica(const BlockTable& table, const AdamWConfig& opt);
  UpdateInfo fetch(std::int64_t version, const std::vector<int>& blocks,
                   const BlockSink& sink) override;
  void push(std::int64_t step, const std::vector<int>& blocks, const float* grads) override;
  std::uint32_t finish() override;
  std::optional<UpdateInfo> update_info(std::int64_t version) const override;
  std::int64_t bytes_fetched() const override { return 0; }
  std::int64_t bytes_pushed() const override { return 0; }
  // The same checkpoint hooks as a holder's (after each update, at the end).
  void set_hooks(HolderHooks hooks) { hooks_ = std::move(hooks); }
  void restore(std::int64_t version, std::map<int, BlockState> blocks);
  HolderHooks::OwnedBlocks owned_blocks() const;

 private:
  const BlockTable& table_;
  AdamWConfig opt_;
  std::vector<BlockState> state_;
  UpdateInfo last_;
  std::map<std::int64_t, UpdateInfo> history_{{0, UpdateInfo{}}};  // by version
  HolderHooks hooks_;
};

}  // namespace pdtrain
