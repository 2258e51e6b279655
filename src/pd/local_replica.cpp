#include "pdtrain/pd/local_replica.hpp"

#include "pdtrain/core/error.hpp"

namespace pdtrain {

LocalReplica::LocalReplica(const BlockTable& table, const AdamWConfig& opt)
    : table_(table), opt_(opt), state_(table.blocks.size()) {
  for (std::size_t b = 0; b < state_.size(); ++b) {
    const auto n = static_cast<std::size_t>(table.blocks[b].numel);
    state_[b].param.resize(n);
    state_[b].m.assign(n, 0.0f);
    state_[b].v.assign(n, 0.0f);
    state_[b].decay = table.blocks[b].decay;
    table.init(static_cast<int>(b), state_[b].param.data());
  }
}

UpdateInfo LocalReplica::fetch(std::int64_t version, const std::vector<int>& blocks,
                               const BlockSink& sink) {
  PDT_CHECK(version == last_.version, "replica asked for version " + std::to_string(version) +
                                          " at version " + std::to_string(last_.version));
  for (int b : blocks) sink(b, state_[b].param.data());
  return last_;
}

void LocalReplica::push(std::int64_t step, const std::vector<int>& blocks, const float* grads) {
  PDT_CHECK(step == last_.version + 1 && blocks.size() == state_.size(),
            "the replicated baseline takes all gradients of the next step at once");
  std::vector<double> sumsq;
  const float* g = grads;
  for (int b : blocks) {
    sumsq.push_back(sum_of_squares(g, table_.blocks[b].numel));
    g += table_.blocks[b].numel;
  }
  const double norm = global_norm(sumsq);
  const double lr = learning_rate(opt_, step);
  const auto scale = static_cast<float>(clip_factor(opt_, norm));
  g = grads;
  for (int b : blocks) {
    adamw_update(opt_, step, lr, scale, g, state_[b]);
    g += table_.blocks[b].numel;
  }
  last_ = UpdateInfo{step, norm, lr};
  history_[step] = last_;
  if (hooks_.after_update) hooks_.after_update(step, [this] { return owned_blocks(); });
}

std::optional<UpdateInfo> LocalReplica::update_info(std::int64_t version) const {
  auto it = history_.find(version);
  if (it == history_.end()) return std::nullopt;
  return it->second;
}

HolderHooks::OwnedBlocks LocalReplica::owned_blocks() const {
  HolderHooks::OwnedBlocks out;
  for (std::size_t b = 0; b < state_.size(); ++b) out[static_cast<int>(b)] = &state_[b];
  return out;
}

void LocalReplica::restore(std::int64_t version, std::map<int, BlockState> blocks) {
  for (std::size_t b = 0; b < state_.size(); ++b) {
    auto it = blocks.find(static_cast<int>(b));
    PDT_CHECK(it != blocks.end() && it->second.param.size() == state_[b].param.size(),
              "restored state lacks block " + table_.blocks[b].name);
    const bool decay = state_[b].decay;
    state_[b] = std::move(it->second);
    state_[b].decay = decay;
  }
  last_ = UpdateInfo{version, 0.0, 0.0};
  history_ = {{version, last_}};
}

std::uint32_t LocalReplica::finish() {
  if (hooks_.at_end) hooks_.at_end(last_.version, [this] { return owned_blocks(); });
  std::vector<const float*> ptrs;
  for (const BlockState& s : state_) ptrs.push_back(s.param.data());
  return table_.canonical_crc(ptrs);
}

}  // namespace pdtrain
