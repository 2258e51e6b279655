// The replicated baseline's step: the rank's own DeviceReplica (its stage shard) scatters each
// version into the stage on the device; the stage's gradients are reduced over the data-parallel
// replicas (with one replica and one rank per replica they never leave the device), completed
// where the holders would complete them (the tied embedding's two stages summed, blocks
// replicated over the tensor group taken from tp rank 0, whose are the ones PD pushes) and the
// replica applies AdamW there.
#include <algorithm>
#include <memory>
#include <vector>

#include "pdtrain/app/parameter_step.hpp"
#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"

namespace pdtrain {

namespace {

class ReplicaStep final : public ParameterStep {
 public:
  ReplicaStep(std::unique_ptr<DeviceReplica> replica, StepParts parts);

  ParameterService& owner() override { return *replica_; }
  double use_version(std::int64_t version) override;
  PassTimes train_pass(std::int64_t, const std::function<void()>& pass) override {
    pass();  // the whole stage is resident
    return {};
  }
  double eval_pass(int, const std::function<void()>& pass) override {
    pass();
    return 0.0;
  }
  void gradients_out(std::int64_t step, StepRecord& rec) override;
  // The replica knows each update's figures as it applies it.
  void learn_update_figures(std::int64_t) override {}
  std::string after_loss_divergence(std::int64_t step) const override {
    return "; its update was not applied, and no checkpoint was written after step " +
           std::to_string(step - 1);
  }
  std::string norm_divergence(const UpdateInfo&) const override {
    return replica_->divergence();
  }
  ParameterFigures figures() const override { return {*replica_}; }
  void write_fetch_figures(const std::string&, int) const override {}  // nothing is fetched

 private:
  void update_on_device(std::int64_t step, StepRecord& rec);
  void reduce_and_push(std::int64_t step, StepRecord& rec);
  void complete_on_host(float* kept);
  void take_tp_replicated(float* kept);
  void sum_tied_embedding(float* kept);
  void complete_on_device(float* kept);
  void take_tp_replicated_on_device(float* kept);
  void sum_tied_embedding_on_device(float* kept);
  std::vector<kernels::KernelOps::Tile> block_tiles(const std::vector<int>& blocks) const;

  std::unique_ptr<DeviceReplica> replica_;
  StageParams& stage_;
  GradReducer& reducer_;
  kernels::KernelOps& ops_;
  StepPhases& phases_;
  const Layout& layout_;
  Collectives& tp_;
  Collectives& pp_;
  bool completes_on_device_;  // NCCL: the tp and pp exchanges below on device memory
  bool one_replica_;  // dp = 1: nothing to sum over replicas
  std::vector<kernels::KernelOps::Tile> tiles_;  // every kept block in the stage's buffers
  std::vector<float> packed_;                    // the reducer's blocks' gradients, packed
  std::vector<float> kept_grads_;                // every kept block's gradient, packed
  std::vector<std::int64_t> at_;                 // per block of the model: its offset there
  std::vector<int> tp_replicated_;               // tp > 1: kept blocks every tp rank has
  std::vector<int> tied_;                        // pp > 1, first or last stage: wte's blocks
  std::vector<int> completed_;                   // both, in block order
  std::vector<float> exchange_;                  // their gradients, on their way
  Buffer<float> exchange_device_;                // on device memory (NCCL)
  std::int64_t have_version_ = -1;               // the version scattered into the stage
};

ReplicaStep::ReplicaStep(std::unique_ptr<DeviceReplica> replica, StepParts parts)
    : replica_(std::move(replica)), stage_(parts.stage), reducer_(parts.reducer),
      ops_(parts.ops), phases_(parts.phases), layout_(parts.layout), tp_(parts.tp),
      pp_(parts.pp), completes_on_device_(parts.tp.device_memory() && parts.pp.device_memory()) {
  const LayoutShape& shape = layout_.shape();
  one_replica_ = shape.dp == 1;
  // The replica keeps the stage's blocks, in order, as the stage's tiles pack them.
  PDT_CHECK(replica_->kept_blocks() == stage_.needed_blocks(),
            "the replicated baseline's replica must keep its stage's blocks");
  tiles_ = stage_.tiles(stage_.needed_blocks());
  const ParamCatalog& cat = stage_.catalog();
  at_.assign(cat.blocks().size(), -1);
  for (int b : replica_->kept_blocks()) {
    at_[b] = replica_->offset(b);
    const BlockInfo& info = cat.block(b);
    const bool replicated = shape.tp > 1 && info.unit < 0;
    const bool tied = shape.pp > 1 && info.tensor == TensorId::wte;
    if (replicated) tp_replicated_.push_back(b);
    if (tied) tied_.push_back(b);
    if (replicated || tied) completed_.push_back(b);
  }
  if (completes_on_device_ && !completed_.empty()) {
    std::int64_t tp_n = 0, tied_n = 0;
    for (int b : tp_replicated_) tp_n += cat.block(b).numel();
    for (int b : tied_) tied_n += cat.block(b).numel();
    exchange_device_ = Buffer<float>(stage_.device(), std::max(tp_n, 2 * tied_n));
  }
  if (one_replica_ || reducer_.on_device()) return;
  packed_.resize(static_cast<std::size_t>(reducer_.total_numel()));
  kept_grads_.resize(static_cast<std::size_t>(replica_->numel()));
}

// The replica's parameters of `version` into the stage, on the device (in bf16 precision
// rounded, with their bf16 copies, as unpack_param does).
double ReplicaStep::use_version(std::int64_t version) {
  if (version == have_version_) return 0.0;
  ScopedPhase t(phases_.timers(), "fetch");
  const double t0 = now_seconds();
  PDT_CHECK(version == replica_->version(),
            "replica at version " + std::to_string(replica_->version()) + ", asked for " +
                std::to_string(version));
  ops_.optimizer().scatter_tiles(stage_.params_device(), stage_.params_bf16_device(),
                                 replica_->params(), tiles_);
  have_version_ = version;
  return now_seconds() - t0;
}

void ReplicaStep::gradients_out(std::int64_t step, StepRecord& rec) {
  if (one_replica_ || reducer_.on_device())
    update_on_device(step, rec);
  else
    reduce_and_push(step, rec);
}

// The gradients never leave the device (one replica, or NCCL between the replicas): the stage's
// are packed on the device, summed over the replicas there in replica order (NCCL:
// GradReducer::allreduce_on_device, every element added in replica order, so the bits do not
// depend on how the buffer is cut), and the replica's optimizer step runs there. Only the
// blocks completed across ranks (the tied embedding, tensor-replicated blocks) are exchanged:
// over the NCCL groups on device memory, or through the host over MPI.
void ReplicaStep::update_on_device(std::int64_t step, StepRecord& rec) {
  const double t0 = now_seconds();
  ops_.optimizer().gather_tiles(replica_->grads(), stage_.grads_device(), tiles_);
  if (!one_replica_) reducer_.allreduce_on_device(replica_->grads(), replica_->numel());
  if (completes_on_device_) {
    complete_on_device(replica_->grads());
  } else if (!completed_.empty()) {
    replica_->download_grads(completed_);
    complete_on_host(replica_->grads_host());
    replica_->upload_grads(completed_);
  }
  const double t1 = now_seconds();
  phases_.record(rec.reduce_ms, "reduce", t0, t1, one_replica_ ? nullptr : "reduce",
                 one_replica_ ? nullptr : "dp");
  replica_->update(step, replica_->grads());
  phases_.record(rec.push_ms, "push", t1, now_seconds(), "update", "pd");
}

// Several replicas, on the host: the gradients PD would push are packed, reduce-scattered and
// all-gathered in a fixed order (GradReducer, as PD's streamer reduces them), completed as the
// holders complete them, and the replica applies the update (every data-parallel replica the
// same one). With NCCL, update_on_device() does the same sums on the GPUs.
void ReplicaStep::reduce_and_push(std::int64_t step, StepRecord& rec) {
  const double t0 = now_seconds();
  const ParamCatalog& cat = stage_.catalog();
  stage_.download_grads();
  float* p = packed_.data();
  for (int b : reducer_.blocks()) {
    stage_.pack_grad(cat.block(b), p);
    p += cat.block(b).numel();
  }
  reducer_.allgather(reducer_.reduce_scatter(packed_.data()), packed_.data());
  p = packed_.data();
  for (int b : reducer_.blocks()) {
    std::copy_n(p, cat.block(b).numel(), kept_grads_.data() + at_[b]);
    p += cat.block(b).numel();
  }
  complete_on_host(kept_grads_.data());
  const double t1 = now_seconds();
  phases_.record(rec.reduce_ms, "reduce", t0, t1, "reduce", "dp");
  replica_->push(step, replica_->kept_blocks(), kept_grads_.data());
  phases_.record(rec.push_ms, "push", t1, now_seconds(), "push", "pd");
}

// The blocks' places in the replica's packed buffers: each block's elements back to back.
std::vector<kernels::KernelOps::Tile> ReplicaStep::block_tiles(const std::vector<int>& blocks) const {
  std::vector<kernels::KernelOps::Tile> tiles;
  for (int b : blocks) {
    const std::int64_t n = stage_.catalog().block(b).numel();
    tiles.push_back({at_[b], 1, n, n});
  }
  return tiles;
}

// complete_on_host's exchanges on device memory, over the NCCL groups: the same operations on
// the same values (a broadcast; a sum of two addends), so the same bits.
void ReplicaStep::complete_on_device(float* kept) {
  if (!tp_replicated_.empty()) take_tp_replicated_on_device(kept);
  if (!tied_.empty()) sum_tied_embedding_on_device(kept);
}

// tp rank 0's gradients of the tp-replicated blocks to every tp rank: an all-gather in which
// only rank 0 has a segment.
void ReplicaStep::take_tp_replicated_on_device(float* kept) {
  const std::vector<kernels::KernelOps::Tile> tiles = block_tiles(tp_replicated_);
  std::int64_t n = 0;
  for (const auto& t : tiles) n += t.cols;
  float* x = exchange_device_.data();
  ops_.optimizer().gather_tiles(x, kept, tiles);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(tp_.size()), 0);
  counts[0] = n;
  tp_.allgather(tp_.rank() == 0 ? x : x + n, x, counts);
  ops_.optimizer().scatter_tiles(kept, nullptr, x, tiles);
}

// The first and the last stage swap their tied-embedding gradients GPU to GPU and add the other's
// (the compute queue runs the sum after the exchange).
void ReplicaStep::sum_tied_embedding_on_device(float* kept) {
  const std::vector<kernels::KernelOps::Tile> tiles = block_tiles(tied_);
  std::int64_t n = 0;
  for (const auto& t : tiles) n += t.cols;
  float *mine = exchange_device_.data(), *theirs = mine + n;
  ops_.optimizer().gather_tiles(mine, kept, tiles);
  const int last = layout_.shape().pp - 1;
  const int peer = layout_.pp_rank() == 0 ? last : 0;
  pp_.send(mine, n, peer, 0);
  pp_.recv(theirs, n, peer, 0);
  pp_.end_group();
  ops_.elementwise().residual_forward(mine, mine, theirs, n);
  ops_.optimizer().scatter_tiles(kept, nullptr, mine, tiles);
  pp_.finish_sends();
}

// `kept`: the kept blocks' reduced gradients, packed as the replica packs them.
void ReplicaStep::complete_on_host(float* kept) {
  if (!tp_replicated_.empty()) take_tp_replicated(kept);
  if (!tied_.empty()) sum_tied_embedding(kept);
}

// Blocks every member of the tensor group keeps have the same gradient on each; PD's holders
// get tp rank 0's (StageParams::pushes), and so does every rank here, so that their copies of
// those parameters stay one.
void ReplicaStep::take_tp_replicated(float* kept) {
  const ParamCatalog& cat = stage_.catalog();
  exchange_.clear();
  for (int b : tp_replicated_)
    exchange_.insert(exchange_.end(), kept + at_[b], kept + at_[b] + cat.block(b).numel());
  MPI_Request r;
  MPI_CHECK(MPI_Ibcast(exchange_.data(), static_cast<int>(exchange_.size()), MPI_FLOAT, 0,
                       layout_.tp_comm(), &r));
  wait_quietly(&r);
  const float* e = exchange_.data();
  for (int b : tp_replicated_) {
    std::copy_n(e, cat.block(b).numel(), kept + at_[b]);
    e += cat.block(b).numel();
  }
}

// The tied embedding's gradient is the sum of the first stage's (the lookup) and the last's
// (the head), each reduced over its replicas: a holder adds the two pushes, and the first and
// last stage here swap theirs and add the other's. Two addends give the same bits in either
// order, so both stages hold the holder's sum.
void ReplicaStep::sum_tied_embedding(float* kept) {
  const ParamCatalog& cat = stage_.catalog();
  const int last = layout_.shape().pp - 1;
  const int peer = layout_.pp_rank() == 0 ? last : 0;
  std::vector<float> mine;
  for (int b : tied_) mine.insert(mine.end(), kept + at_[b], kept + at_[b] + cat.block(b).numel());
  exchange_.resize(mine.size());
  MPI_Request r[2];
  MPI_CHECK(MPI_Irecv(exchange_.data(), static_cast<int>(exchange_.size()), MPI_FLOAT, peer, 0,
                      layout_.pp_comm(), &r[0]));
  MPI_CHECK(MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, peer, 0,
                      layout_.pp_comm(), &r[1]));
  wait_quietly(&r[0]);
  wait_quietly(&r[1]);
  const float* e = exchange_.data();
  for (int b : tied_) {
    float* g = kept + at_[b];
    for (std::int64_t i = 0; i < cat.block(b).numel(); ++i) g[i] += e[i];
    e += cat.block(b).numel();
  }
}

}  // namespace

std::unique_ptr<ParameterStep> make_parameter_step(std::unique_ptr<DeviceReplica> replica,
                                                   StepParts parts) {
  return std::make_unique<ReplicaStep>(std::move(replica), parts);
}

}  // namespace pdtrain
