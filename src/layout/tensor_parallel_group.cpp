#include "pdtrain/layout/tensor_parallel_group.hpp"

#include "pdtrain/core/mpi_check.hpp"
#include "pdtrain/core/quiet_wait.hpp"

namespace pdtrain {

void TensorParallelGroup::allreduce_max(float* data, std::int64_t n) {
  if (size() == 1 || n == 0) return;
  // Max is exact in any order, so MPI's own reduction is deterministic here.
  MPI_Request req;
  MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_MAX, comm_,
                           &req));
  wait_quietly(&req);
}

}  // namespace pdtrain
