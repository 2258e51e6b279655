#include "comm.hpp"

#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain::ckpt::detail {
namespace {
int size_of(MPI_Comm comm) {
  int n = 1;
  MPI_CHECK(MPI_Comm_size(comm, &n));
  return n;
}
}  // namespace

void allreduce_bor(MPI_Comm comm, std::vector<std::uint32_t>& v) {
  if (size_of(comm) == 1) return;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT32_T,
                          MPI_BOR, comm));
}

void allreduce_max(MPI_Comm comm, std::vector<std::uint32_t>& v) {
  if (size_of(comm) == 1) return;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT32_T,
                          MPI_MAX, comm));
}

std::int64_t allreduce_sum(MPI_Comm comm, std::int64_t x) {
  if (size_of(comm) == 1) return x;
  std::int64_t s = 0;
  MPI_CHECK(MPI_Allreduce(&x, &s, 1, MPI_INT64_T, MPI_SUM, comm));
  return s;
}

bool allreduce_and(MPI_Comm comm, bool x) {
  if (size_of(comm) == 1) return x;
  int mine = x ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

void bcast_u32(MPI_Comm comm, std::uint32_t& x, int root) {
  if (size_of(comm) == 1) return;
  MPI_CHECK(MPI_Bcast(&x, 1, MPI_UINT32_T, root, comm));
}

std::vector<char> gather_bytes(MPI_Comm comm, const std::vector<char>& mine, int root) {
  const int n = size_of(comm);
  if (n == 1) return mine;
  int rank = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &rank));
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(rank == root ? n : 0);
  MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  const std::vector<int> displs = displacements(counts);
  std::vector<char> all(rank == root ? static_cast<std::size_t>(displs.back() + counts.back()) : 0);
  MPI_CHECK(MPI_Gatherv(mine.data(), count, MPI_CHAR, all.data(), counts.data(), displs.data(),
                        MPI_CHAR, root, comm));
  return all;
}

}  // namespace pdtrain::ckpt::detail
