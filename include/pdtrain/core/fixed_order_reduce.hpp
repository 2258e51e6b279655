#pragma once
// Sums over the ranks of a communicator that are the same bits on every run. The data is cut
// into one contiguous segment per rank; rank r receives every rank's copy of segment r and adds
// them in rank order 0, 1, ..., n-1, whatever the message timing. (MPI's own reductions may add
// in an order that depends on the algorithm and the message sizes, which would let replicas of
// the same activation or gradient drift apart.) The tensor-parallel all-reduce (layout/) and the
// data-parallel gradient reduction (schedule/) both run on this.
//
// Sizes are 64-bit: segments travel as point-to-point messages of at most `max_message` floats
// (MPI counts are int), so a segment above INT_MAX floats is several messages.
#include <mpi.h>

#include <cstdint>
#include <vector>

namespace pdtrain {

class FixedOrderReducer {
 public:
  static constexpr std::int64_t kMaxMessageFloats = std::int64_t{1} << 30;  // 4 GiB

  // Collective over `comm`, which it duplicates, so its messages never match anyone else's.
  explicit FixedOrderReducer(MPI_Comm comm, std::int64_t max_message = kMaxMessageFloats);
  ~FixedOrderReducer();
  FixedOrderReducer(const FixedOrderReducer&) = delete;
  FixedOrderReducer& operator=(const FixedOrderReducer&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // `data` holds this rank's copy of every segment, back to back in rank order (counts[r]
  // floats for rank r, the same counts on every rank). Returns the sum over the ranks of this
  // rank's segment, added in rank order; valid until the next call (on one rank: `data`
  // itself, nothing copied).
  const float* reduce_scatter(const float* data, const std::vector<std::int64_t>& counts);
  // Puts every rank's `segment` (counts[rank] floats) at its place in `out`: an all-gather.
  // `segment` may be this rank's place in `out`, but no other rank's.
  void allgather(const float* segment, float* out, const std::vector<std::int64_t>& counts);
  // In place: reduce_scatter over `n` split evenly, then allgather.
  void allreduce(float* data, std::int64_t n);

 private:
  void post_receive(float* to, std::int64_t n, int source, int tag);
  void post_send(const float* from, std::int64_t n, int dest, int tag);
  void wait_for_messages();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::int64_t max_message_;
  std::vector<float> received_, sum_;  // rank r's copy of this rank's segment at r * its size
  std::vector<MPI_Request> requests_;
};

}  // namespace pdtrain
