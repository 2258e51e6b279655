#include "pdtrain/core/mpi_collectives.hpp"

#include <climits>

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"

namespace pdtrain {

namespace {
int message_count(std::int64_t n) {
  PDT_CHECK(n >= 0 && n <= INT_MAX, "a point-to-point message above INT_MAX floats");
  return static_cast<int>(n);
}
}  // namespace

MpiCollectives::MpiCollectives(MPI_Comm comm, std::int64_t max_message)
    : reduce_(comm, max_message) {
  MPI_CHECK(MPI_Comm_dup(comm, &comm_));
}

MpiCollectives::~MpiCollectives() {
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiCollectives::allreduce_max(float* data, std::int64_t n) {
  if (size() == 1 || n == 0) return;
  // Max is exact in any order, so MPI's own reduction is deterministic here.
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, message_count(n), MPI_FLOAT, MPI_MAX, comm_, &req));
  wait_quietly(&req);
}

void MpiCollectives::send(const float* data, std::int64_t n, int peer, int tag) {
  sends_.emplace_back();
  MPI_CHECK(MPI_Isend(data, message_count(n), MPI_FLOAT, peer, tag, comm_, &sends_.back()));
}

void MpiCollectives::recv(float* data, std::int64_t n, int peer, int tag) {
  receives_.emplace_back();
  MPI_CHECK(MPI_Irecv(data, message_count(n), MPI_FLOAT, peer, tag, comm_, &receives_.back()));
}

void MpiCollectives::end_group() {
  // Sends are left in flight: MPI moves them while this rank waits or computes, and a send
  // that waited for its receive here could deadlock a schedule that is not paired.
  wait_all_quietly(static_cast<int>(receives_.size()), receives_.data());
  receives_.clear();
}

void MpiCollectives::finish_sends() {
  wait_all_quietly(static_cast<int>(sends_.size()), sends_.data());
  sends_.clear();
}

}  // namespace pdtrain
