#include "pdtrain/pd/device_replica.hpp"

#include <algorithm>
#include <cmath>

#include "pdtrain/core/error.hpp"
#include "pdtrain/optim/divergence.hpp"

namespace pdtrain {

DeviceReplica::DeviceReplica(const BlockTable& table, const AdamWConfig& opt, Device& device,
                             kernels::KernelOps& ops)
    : table_(table), opt_(opt), device_(device), ops_(ops) {
  const int n = static_cast<int>(table.blocks.size());
  offsets_.assign(static_cast<std::size_t>(n) + 1, 0);
  for (int b = 0; b < n; ++b) {
    const BlockDesc& d = table.blocks[b];
    offsets_[b + 1] = offsets_[b] + d.numel;
    sizes_.push_back(d.numel);
    if (runs_.empty() || runs_.back().decay != d.decay) runs_.push_back({b, b, d.decay});
    runs_.back().last = b + 1;
  }
  const AllocationLabel label(
      device, "the replicated baseline's parameters, AdamW moments and gradients (parallel.holders "
              "= 0: 4 x " + std::to_string(numel()) + " floats, " +
              std::to_string(16 * numel()) + " bytes in all)");
  params_ = Mirrored<float>(device, numel());
  m_ = Mirrored<float>(device, numel());
  v_ = Mirrored<float>(device, numel());
  grads_ = Mirrored<float>(device, numel());
  sumsq_ = Mirrored<double>(device, n);
  std::vector<std::pair<int, float*>> initial;
  for (int b = 0; b < n; ++b) initial.emplace_back(b, params_.host() + offsets_[b]);
  fill_initial_values(table, initial);
  params_.upload();
}

UpdateInfo DeviceReplica::fetch(std::int64_t version, const std::vector<int>& blocks,
                                const BlockSink& sink) {
  PDT_CHECK(version == last_.version, "replica asked for version " + std::to_string(version) +
                                          " at version " + std::to_string(last_.version));
  params_.download();
  device_.synchronize();
  for (int b : blocks) sink(b, params_.host() + offsets_[b]);
  return last_;
}

void DeviceReplica::push(std::int64_t step, const std::vector<int>& blocks, const float* grads) {
  PDT_CHECK(blocks.size() == table_.blocks.size() &&
                std::is_sorted(blocks.begin(), blocks.end()),
            "the replicated baseline takes all gradients of the next step at once");
  if (device_.is_host()) {
    update(step, grads);
    return;
  }
  std::copy_n(grads, numel(), grads_.host());
  grads_.upload();
  update(step, grads_.device());
}

UpdateInfo DeviceReplica::update(std::int64_t step, const float* g) {
  PDT_CHECK(step == last_.version + 1, "replica update of step " + std::to_string(step) +
                                           " at version " + std::to_string(last_.version));
  ops_.block_sums_of_squares(sumsq_.device(), g, sizes_);
  sumsq_.download();
  device_.synchronize();
  const double* s = sumsq_.host();
  const std::vector<double> by_block(s, s + sizes_.size());
  const double norm = global_norm(by_block);
  const double lr = learning_rate(opt_, step);
  const auto scale = static_cast<float>(clip_factor(opt_, norm));
  last_ = UpdateInfo{step, norm, lr};
  history_[step] = last_;
  if (diverged(step, norm, by_block)) return last_;  // the version advances, nothing changes
  for (const DecayRun& r : runs_) {
    const std::int64_t at = offsets_[r.first], n = offsets_[r.last] - at;
    ops_.adamw(params_.device() + at, m_.device() + at, v_.device() + at, g + at, n,
               adamw_step(opt_, step, lr, scale, r.decay));
  }
  if (hooks_.after_update) hooks_.after_update(step, [this] { return owned_blocks(); });
  return last_;
}

// The divergence guard, as on the holders: a norm that is not finite is never applied (nor any
// later step's), naming the first block whose gradient is not finite.
bool DeviceReplica::diverged(std::int64_t step, double norm, const std::vector<double>& by_block) {
  if (diverged_at_ > 0 || diverged_step_ > 0) return true;  // diverged_step_: the loss did
  if (std::isfinite(norm)) return false;
  diverged_at_ = step;
  divergence_ = norm_divergence_message(step, norm, by_block, [this](int b) {
    return table_.blocks[b].name + " (the replicated baseline: every compute rank)";
  });
  return true;
}

std::optional<UpdateInfo> DeviceReplica::update_info(std::int64_t version) const {
  auto it = history_.find(version);
  if (it == history_.end()) return std::nullopt;
  return it->second;
}

HolderHooks::OwnedBlocks DeviceReplica::owned_blocks() const {
  params_.download();
  m_.download();
  v_.download();
  device_.synchronize();
  host_.resize(table_.blocks.size());
  HolderHooks::OwnedBlocks out;
  for (std::size_t b = 0; b < host_.size(); ++b) {
    const auto at = static_cast<std::size_t>(offsets_[b]), n = static_cast<std::size_t>(sizes_[b]);
    BlockState& s = host_[b];
    s.param.assign(params_.host() + at, params_.host() + at + n);
    s.m.assign(m_.host() + at, m_.host() + at + n);
    s.v.assign(v_.host() + at, v_.host() + at + n);
    s.decay = table_.blocks[b].decay;
    out[static_cast<int>(b)] = &s;
  }
  return out;
}

void DeviceReplica::restore(std::int64_t version, std::map<int, BlockState> blocks) {
  for (std::size_t b = 0; b < table_.blocks.size(); ++b) {
    auto it = blocks.find(static_cast<int>(b));
    PDT_CHECK(it != blocks.end() &&
                  static_cast<std::int64_t>(it->second.param.size()) == sizes_[b],
              "restored state lacks block " + table_.blocks[b].name);
    const std::int64_t at = offsets_[b];
    std::copy(it->second.param.begin(), it->second.param.end(), params_.host() + at);
    std::copy(it->second.m.begin(), it->second.m.end(), m_.host() + at);
    std::copy(it->second.v.begin(), it->second.v.end(), v_.host() + at);
  }
  params_.upload();
  m_.upload();
  v_.upload();
  last_ = UpdateInfo{version, 0.0, 0.0};
  history_ = {{version, last_}};
}

std::uint32_t DeviceReplica::finish_and_checksum() {
  if (diverged_at_ > 0 || diverged_step_ > 0) {
    if (hooks_.after_divergence) hooks_.after_divergence();
  } else if (hooks_.at_end) {
    hooks_.at_end(last_.version, [this] { return owned_blocks(); });
  }
  params_.download();
  device_.synchronize();
  std::vector<const float*> ptrs;
  for (std::size_t b = 0; b < table_.blocks.size(); ++b) ptrs.push_back(params_.host() + offsets_[b]);
  return table_.canonical_crc(ptrs);
}

}  // namespace pdtrain
