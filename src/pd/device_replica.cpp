#include "pdtrain/pd/device_replica.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/optim/divergence.hpp"

namespace pdtrain {

namespace {

std::vector<int> every_block(const BlockTable& table) {
  std::vector<int> all(table.blocks.size());
  for (std::size_t b = 0; b < all.size(); ++b) all[b] = static_cast<int>(b);
  return all;
}

template <class T> MPI_Datatype mpi_type();
template <> MPI_Datatype mpi_type<int>() { return MPI_INT; }
template <> MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }

// Every rank's `mine` of `comm`, one after another in rank order, on `root` (empty elsewhere).
template <class T>
std::vector<T> gather_varying(MPI_Comm comm, int root, const std::vector<T>& mine) {
  int rank = 0, size = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  MPI_CHECK(MPI_Comm_size(comm, &size));
  PDT_CHECK(mine.size() <= static_cast<std::size_t>(INT_MAX), "a replica rank's blocks are too large to gather");
  const int n = static_cast<int>(mine.size());
  std::vector<int> counts(static_cast<std::size_t>(size)), displs(counts.size(), 0);
  MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  std::int64_t total = 0;
  for (int r = 0; r < size && rank == root; ++r) {
    displs[r] = static_cast<int>(std::min<std::int64_t>(total, INT_MAX));
    total += counts[r];
  }
  PDT_CHECK(total <= INT_MAX, "a replica's blocks are too large to gather on one rank");
  std::vector<T> all(static_cast<std::size_t>(total));
  MPI_Request r;
  MPI_CHECK(MPI_Igatherv(mine.data(), n, mpi_type<T>(), all.data(), counts.data(), displs.data(),
                         mpi_type<T>(), root, comm, &r));
  wait_quietly(&r);
  return all;
}

}  // namespace

DeviceReplica::DeviceReplica(const BlockTable& table, const AdamWConfig& opt, Device& device,
                             kernels::KernelOps& ops, ReplicaShard shard)
    : table_(table), opt_(opt), device_(device), ops_(ops),
      kept_(shard.kept.empty() ? every_block(table) : std::move(shard.kept)),
      slot_of_(table.blocks.size(), -1), replica_(shard.replica), crc_root_(shard.crc_root) {
  PDT_CHECK(std::is_sorted(kept_.begin(), kept_.end()), "a replica keeps its blocks in block order");
  const int n = static_cast<int>(kept_.size());
  offsets_.assign(static_cast<std::size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    const BlockDesc& d = table.blocks[kept_[i]];
    slot_of_[kept_[i]] = i;
    offsets_[i + 1] = offsets_[i] + d.numel;
    sizes_.push_back(d.numel);
    if (runs_.empty() || runs_.back().decay != d.decay) runs_.push_back({i, i, d.decay});
    runs_.back().last = i + 1;
  }
  counted_.assign(kept_.size(), shard.counted.empty());
  for (int b : shard.counted) counted_[slot(b)] = true;
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
  for (int i = 0; i < n; ++i) initial.emplace_back(kept_[i], params_.host() + offsets_[i]);
  fill_initial_values(table, initial);
  params_.upload();
}

int DeviceReplica::slot(int block) const {
  const int i = block >= 0 && block < static_cast<int>(slot_of_.size()) ? slot_of_[block] : -1;
  PDT_CHECK(i >= 0, "block " + std::to_string(block) + " is not kept by this replica rank");
  return i;
}

UpdateInfo DeviceReplica::fetch(std::int64_t version, const std::vector<int>& blocks,
                                const BlockSink& sink) {
  PDT_CHECK(version == last_.version, "replica asked for version " + std::to_string(version) +
                                          " at version " + std::to_string(last_.version));
  params_.download();
  device_.synchronize();
  for (int b : blocks) sink(b, params_.host() + offsets_[slot(b)]);
  return last_;
}

void DeviceReplica::push(std::int64_t step, const std::vector<int>& blocks, const float* grads) {
  PDT_CHECK(blocks == kept_, "the replicated baseline takes all gradients of the next step at once");
  if (device_.is_host()) {
    update(step, grads);
    return;
  }
  std::copy_n(grads, numel(), grads_.host());
  grads_.upload();
  update(step, grads_.device());
}

void DeviceReplica::download_grads(const std::vector<int>& blocks) {
  if (device_.is_host()) return;
  for (int b : blocks) {
    const int i = slot(b);
    device_.copy(grads_.host() + offsets_[i], grads_.device() + offsets_[i],
                 static_cast<std::size_t>(sizes_[i]) * sizeof(float));
  }
  device_.synchronize();
}

void DeviceReplica::upload_grads(const std::vector<int>& blocks) {
  if (device_.is_host()) return;
  for (int b : blocks) {
    const int i = slot(b);
    device_.copy(grads_.device() + offsets_[i], grads_.host() + offsets_[i],
                 static_cast<std::size_t>(sizes_[i]) * sizeof(float));
  }
}

UpdateInfo DeviceReplica::update(std::int64_t step, const float* g) {
  PDT_CHECK(step == last_.version + 1, "replica update of step " + std::to_string(step) +
                                           " at version " + std::to_string(last_.version));
  ops_.optimizer().block_sums_of_squares(sumsq_.device(), g, sizes_);
  sumsq_.download();
  device_.synchronize();
  bool loss_diverged = false;
  const std::vector<double> by_block = replica_sums_of_squares(step, sumsq_.host(), &loss_diverged);
  if (loss_diverged && diverged_step_ == 0) diverged_step_ = step;
  const double norm = global_norm(by_block);
  const double lr = learning_rate(opt_, step);
  const auto scale = static_cast<float>(clip_factor(opt_, norm));
  last_ = UpdateInfo{step, norm, lr};
  history_[step] = last_;
  if (diverged(step, norm, by_block)) return last_;  // the version advances, nothing changes
  for (const DecayRun& r : runs_) {
    const std::int64_t at = offsets_[r.first], n = offsets_[r.last] - at;
    ops_.optimizer().adamw(params_.device() + at, m_.device() + at, v_.device() + at, g + at,
                           n, adamw_step(opt_, step, lr, scale, r.decay));
  }
  if (hooks_.after_update) hooks_.after_update(step, [this] { return owned_blocks(); });
  return last_;
}

// Every block is counted on exactly one rank of the replica and is 0 on the others, and x + 0
// is x, so the sum over the replica is each block's own sum of squares whatever the order the
// reduction takes: the vector the holders assemble (agree_on_norm), added up the same way.
std::vector<double> DeviceReplica::replica_sums_of_squares(std::int64_t step,
                                                           const double* kept_sumsq,
                                                           bool* loss_diverged) const {
  const std::size_t blocks = table_.blocks.size();
  std::vector<double> sums(blocks + 1, 0.0);  // the last: ranks that saw the loss diverge
  for (std::size_t i = 0; i < kept_.size(); ++i)
    if (counted_[i]) sums[static_cast<std::size_t>(kept_[i])] = kept_sumsq[i];
  sums[blocks] = diverged_step_ == step ? 1.0 : 0.0;
  if (replica_ != MPI_COMM_SELF) {
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(sums.size()), MPI_DOUBLE,
                             MPI_SUM, replica_, &r));
    wait_quietly(&r);
  }
  *loss_diverged = sums[blocks] > 0.0;
  sums.pop_back();
  return sums;
}

// The divergence guard, as on the holders: a norm that is not finite is never applied (nor any
// later step's), naming the first block whose gradient is not finite.
bool DeviceReplica::diverged(std::int64_t step, double norm, const std::vector<double>& by_block) {
  if (diverged_at_ > 0 || diverged_step_ > 0) return true;  // diverged_step_: the loss did
  if (std::isfinite(norm)) return false;
  diverged_at_ = step;
  divergence_ = norm_divergence_message(step, norm, by_block, [this](int b) {
    return table_.blocks[b].name + " (the replicated baseline: every replica)";
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
  host_.resize(kept_.size());
  HolderHooks::OwnedBlocks out;
  for (std::size_t i = 0; i < kept_.size(); ++i) {
    if (!counted_[i]) continue;
    const auto at = static_cast<std::size_t>(offsets_[i]), n = static_cast<std::size_t>(sizes_[i]);
    BlockState& s = host_[i];
    s.param.assign(params_.host() + at, params_.host() + at + n);
    s.m.assign(m_.host() + at, m_.host() + at + n);
    s.v.assign(v_.host() + at, v_.host() + at + n);
    s.decay = table_.blocks[kept_[i]].decay;
    out[kept_[i]] = &s;
  }
  return out;
}

void DeviceReplica::restore(std::int64_t version, std::map<int, BlockState> blocks) {
  for (std::size_t i = 0; i < kept_.size(); ++i) {
    auto it = blocks.find(kept_[i]);
    PDT_CHECK(it != blocks.end() &&
                  static_cast<std::int64_t>(it->second.param.size()) == sizes_[i],
              "restored state lacks block " + table_.blocks[kept_[i]].name);
    const std::int64_t at = offsets_[i];
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
  return canonical_crc();
}

// As the holders compute it (HolderServer::send_final_crc): the counted blocks gathered on one
// rank, in block order, into the canonical array. A replica alone has them all.
std::uint32_t DeviceReplica::canonical_crc() const {
  if (crc_root_ < 0) return 0;
  std::vector<int> ids;
  std::vector<float> mine;
  for (std::size_t i = 0; i < kept_.size(); ++i)
    if (counted_[i]) {
      ids.push_back(kept_[i]);
      mine.insert(mine.end(), params_.host() + offsets_[i], params_.host() + offsets_[i + 1]);
    }
  int rank = 0, size = 1;
  if (replica_ != MPI_COMM_SELF) {
    MPI_CHECK(MPI_Comm_rank(replica_, &rank));
    MPI_CHECK(MPI_Comm_size(replica_, &size));
  }
  const bool root = rank == crc_root_;
  std::vector<int> all_ids = ids;
  std::vector<float> all = mine;
  if (size > 1) {
    all_ids = gather_varying(replica_, crc_root_, ids);
    all = gather_varying(replica_, crc_root_, mine);
  }
  if (!root) return 0;
  std::vector<const float*> ptrs(table_.blocks.size(), nullptr);
  std::int64_t at = 0;
  for (int b : all_ids) {
    PDT_CHECK(ptrs[b] == nullptr, "block " + table_.blocks[b].name + " counted twice in a replica");
    ptrs[b] = all.data() + at;
    at += table_.blocks[b].numel;
  }
  for (std::size_t b = 0; b < ptrs.size(); ++b)
    PDT_CHECK(ptrs[b] != nullptr, "block " + table_.blocks[b].name + " counted by no rank of a replica");
  return table_.canonical_crc(ptrs);
}

}  // namespace pdtrain
