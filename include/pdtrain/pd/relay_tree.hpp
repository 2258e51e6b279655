#pragma once
// The fan-out of fetch replies over the data-parallel replicas: replica 0 of a (pp, tp)
// position asks the holders, and replica r forwards every reply to replicas 2r+1 and 2r+2
// (so no rank sends more than two copies), point to point over a duplicate of the
// data-parallel communicator, in ticket order and holder order, so MPI's non-overtaking rule
// matches the messages. Point to point rather than MPI_Ibcast: the compute thread runs
// non-blocking collectives at the same time, and Open MPI 4.1's libnbc is not safe to drive
// from two threads. A relayed reply is one contiguous message, headers and payloads back to
// back, which Open MPI moves by a single copy the receiver makes alone.
#include <mpi.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "pdtrain/core/size_pool.hpp"
#include "pdtrain/layout/layout.hpp"

namespace pdtrain {

class RelayTree {
 public:
  explicit RelayTree(const Layout& layout);  // collective over the data-parallel group
  ~RelayTree();
  RelayTree(const RelayTree&) = delete;
  RelayTree& operator=(const RelayTree&) = delete;

  bool active() const { return comm_ != MPI_COMM_NULL; }  // dp > 1
  // The parent's next reply, if it has arrived, into the buffer `buffer_for(bytes)` gives.
  bool receive(const std::function<ByteBuffer&(std::size_t bytes)>& buffer_for);
  // Sends `reply` on to each child; the requests are added to `sends`.
  void forward(const ByteBuffer& reply, std::vector<MPI_Request>& sends) const;

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;  // a duplicate of dp_comm
  int parent_ = -1;
  std::vector<int> children_;  // in comm_
};

}  // namespace pdtrain
