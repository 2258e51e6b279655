#include "pdtrain/schedule/grad_reduce.hpp"

#include "pdtrain/core/error.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/mpi_collectives.hpp"
#include "pdtrain/core/quiet_wait.hpp"
#include "pdtrain/core/test_hooks.hpp"
#include "pdtrain/layout/placement.hpp"

namespace pdtrain {

GradReducer::GradReducer(MPI_Comm dp_comm, std::vector<int> blocks,
                         std::vector<std::int64_t> numel, Collectives* on_device)
    : comm_(dp_comm), replicas_(std::make_unique<MpiCollectives>(dp_comm)), device_(on_device) {
  me_ = replicas_->rank();
  dp_ = replicas_->size();
  groups_.push_back(make_group(std::move(blocks), numel));
}

GradReducer::GradReducer(MPI_Comm dp_comm, const std::vector<std::vector<int>>& groups,
                         const std::vector<std::int64_t>& numel_by_block, Collectives* on_device)
    : comm_(dp_comm), replicas_(std::make_unique<MpiCollectives>(dp_comm)), device_(on_device) {
  me_ = replicas_->rank();
  dp_ = replicas_->size();
  for (const std::vector<int>& blocks : groups) {
    std::vector<std::int64_t> numel;
    for (int b : blocks) numel.push_back(numel_by_block[b]);
    groups_.push_back(make_group(blocks, numel));
  }
}

GradReducer::Group GradReducer::make_group(std::vector<int> blocks,
                                           const std::vector<std::int64_t>& numel) const {
  Group g;
  g.blocks = std::move(blocks);
  g.counts.assign(dp_, 0);
  const std::vector<int> seg = place_blocks(numel, dp_);  // contiguous, balanced
  for (std::size_t i = 0; i < g.blocks.size(); ++i) {
    g.counts[seg[i]] += numel[i];
    if (seg[i] < me_) g.my_offset += numel[i];
    g.total += numel[i];
    if (seg[i] == me_) g.mine.push_back(g.blocks[i]);
  }
  return g;
}

void GradReducer::before_device_reduce() {
  PDT_CHECK(on_device(), "a device reduce without the replicas' NCCL collectives");
  PDT_CHECK(device_->size() == dp_, "the dp group's NCCL and MPI collectives differ in size");
  test_hooks::stall_point("dp_reduce");
}

void GradReducer::allreduce_on_device(float* data, std::int64_t n) {
  before_device_reduce();
  device_->allreduce_sum(data, n);
}

const float* GradReducer::reduce_scatter_on_device(const float* packed, int g) {
  before_device_reduce();
  return device_->reduce_scatter(packed, groups_[g].counts);
}

double GradReducer::sum(double local) {
  std::vector<double> all(static_cast<std::size_t>(dp_));
  MPI_Request req;
  MPI_CHECK(MPI_Iallgather(&local, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, comm_, &req));
  wait_quietly(&req);
  double s = 0.0;
  for (double v : all) s += v;
  return s;
}

}  // namespace pdtrain
