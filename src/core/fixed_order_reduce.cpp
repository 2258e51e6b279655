#include "pdtrain/core/fixed_order_reduce.hpp"

#include <algorithm>
#include <climits>

#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"

namespace pdtrain {

namespace {
// One tag per phase: a fast rank's all-gather messages never match a reduce-scatter receive.
// Within a phase, messages between two ranks match in the order sent (MPI's non-overtaking rule),
// which is also the order of the pieces and of the calls.
constexpr int kReduceScatterTag = 1, kAllgatherTag = 2;
}  // namespace

FixedOrderReducer::FixedOrderReducer(MPI_Comm comm, std::int64_t max_message)
    : max_message_(max_message) {
  PDT_CHECK(max_message >= 1 && max_message <= INT_MAX, "max_message must be 1..INT_MAX floats");
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

FixedOrderReducer::~FixedOrderReducer() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

const float* FixedOrderReducer::reduce_scatter(const float* data,
                                               const std::vector<std::int64_t>& counts) {
  const std::vector<std::int64_t> starts = displacements(counts);
  const std::int64_t mine = counts[rank_];
  if (size_ == 1) return data;  // nothing to add: no copy
  sum_.resize(static_cast<std::size_t>(mine));
  received_.resize(static_cast<std::size_t>(mine * size_));
  // Peers in turn from the next rank on, so that not every rank sends to rank 0 first.
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    post_receive(received_.data() + r * mine, mine, r, kReduceScatterTag);
  }
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    post_send(data + starts[r], counts[r], r, kReduceScatterTag);
  }
  wait_for_messages();
  const auto copy_of = [&](int r) {
    return r == rank_ ? data + starts[rank_] : received_.data() + r * mine;
  };
  std::copy_n(copy_of(0), mine, sum_.begin());
  for (int r = 1; r < size_; ++r) {
    const float* add = copy_of(r);
    for (std::int64_t i = 0; i < mine; ++i) sum_[i] += add[i];
  }
  return sum_.data();
}

void FixedOrderReducer::allgather(const float* segment, float* out,
                                  const std::vector<std::int64_t>& counts) {
  const std::vector<std::int64_t> starts = displacements(counts);
  float* mine = out + starts[rank_];
  if (segment != mine) std::copy_n(segment, counts[rank_], mine);
  for (int k = 1; k < size_; ++k) {
    const int r = (rank_ + k) % size_;
    post_receive(out + starts[r], counts[r], r, kAllgatherTag);
  }
  for (int k = 1; k < size_; ++k)
    post_send(mine, counts[rank_], (rank_ + k) % size_, kAllgatherTag);
  wait_for_messages();
}

void FixedOrderReducer::allreduce(float* data, std::int64_t n) {
  if (size_ == 1 || n == 0) return;
  const std::vector<std::int64_t> counts = split_evenly(n, size_);
  allgather(reduce_scatter(data, counts), data, counts);
}

void FixedOrderReducer::post_receive(float* to, std::int64_t n, int source, int tag) {
  for (const MessagePiece& p : message_pieces(n, max_message_)) {
    requests_.emplace_back();
    MPI_CHECK(MPI_Irecv(to + p.offset, p.count, MPI_FLOAT, source, tag, comm_, &requests_.back()));
  }
}

void FixedOrderReducer::post_send(const float* from, std::int64_t n, int dest, int tag) {
  for (const MessagePiece& p : message_pieces(n, max_message_)) {
    requests_.emplace_back();
    MPI_CHECK(MPI_Isend(from + p.offset, p.count, MPI_FLOAT, dest, tag, comm_, &requests_.back()));
  }
}

void FixedOrderReducer::wait_for_messages() {
  wait_all_quietly(static_cast<int>(requests_.size()), requests_.data());
  requests_.clear();
}

}  // namespace pdtrain
