#include "comm.hpp"

#include <cstring>

#include "pdtrain/core/counts.hpp"
#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain::ckpt::detail {
namespace {
// Gathers every rank's bytes on root (concatenated in rank order); others get {}.
std::vector<char> gather_bytes(MPI_Comm comm, const std::vector<char>& mine, int root) {
  const int n = comm_size(comm);
  if (n == 1) return mine;
  const int rank = comm_rank(comm);
  int count = static_cast<int>(mine.size());
  std::vector<int> counts(rank == root ? n : 0);
  MPI_CHECK(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, root, comm));
  const std::vector<int> displs = displacements(counts);
  std::vector<char> all(rank == root ? static_cast<std::size_t>(displs.back() + counts.back()) : 0);
  MPI_CHECK(MPI_Gatherv(mine.data(), count, MPI_CHAR, all.data(), counts.data(), displs.data(),
                        MPI_CHAR, root, comm));
  return all;
}
}  // namespace

void allreduce_bor(MPI_Comm comm, std::vector<std::uint32_t>& v) {
  if (comm_size(comm) == 1) return;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT32_T,
                          MPI_BOR, comm));
}

void allreduce_max(MPI_Comm comm, std::vector<std::uint32_t>& v) {
  if (comm_size(comm) == 1) return;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, v.data(), static_cast<int>(v.size()), MPI_UINT32_T,
                          MPI_MAX, comm));
}

std::int64_t allreduce_sum(MPI_Comm comm, std::int64_t x) {
  if (comm_size(comm) == 1) return x;
  std::int64_t s = 0;
  MPI_CHECK(MPI_Allreduce(&x, &s, 1, MPI_INT64_T, MPI_SUM, comm));
  return s;
}

bool allreduce_and(MPI_Comm comm, bool x) {
  if (comm_size(comm) == 1) return x;
  int mine = x ? 1 : 0, all = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, comm));
  return all == 1;
}

void bcast_u32(MPI_Comm comm, std::uint32_t& x, int root) {
  if (comm_size(comm) == 1) return;
  MPI_CHECK(MPI_Bcast(&x, 1, MPI_UINT32_T, root, comm));
}

std::optional<std::uint32_t> combine_crc_pieces_on_root(MPI_Comm comm,
                                                        const std::vector<CrcPiece>& mine,
                                                        std::int64_t total_numel) {
  std::vector<char> bytes(mine.size() * sizeof(CrcPiece));
  if (!bytes.empty()) std::memcpy(bytes.data(), mine.data(), bytes.size());
  const std::vector<char> all = gather_bytes(comm, bytes, 0);
  if (comm_rank(comm) != 0) return std::nullopt;
  std::vector<CrcPiece> every(all.size() / sizeof(CrcPiece));
  if (!all.empty()) std::memcpy(every.data(), all.data(), all.size());
  return combine_crc_pieces(std::move(every), total_numel);
}

}  // namespace pdtrain::ckpt::detail
