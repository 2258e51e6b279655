#include "pdtrain/core/agreement.hpp"

#include <climits>
#include <cstdint>

#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain {

namespace {
[[noreturn]] void throw_in_scope(Error e, ErrorScope scope) {
  if (scope == ErrorScope::job) e.mark_collective();
  throw e;
}
}  // namespace

void rethrow_collectively(MPI_Comm comm, const Error* local, ErrorScope scope) {
  if (comm_size(comm) == 1) {
    if (local) throw_in_scope(*local, scope);
    return;
  }
  int mine = local ? comm_rank(comm) : INT_MAX, first = INT_MAX;
  MPI_CHECK(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm));
  if (first == INT_MAX) return;
  int code = local ? static_cast<int>(local->code()) : 0;
  std::string msg = local ? local->what() : "";
  MPI_CHECK(MPI_Bcast(&code, 1, MPI_INT, first, comm));
  broadcast_string(comm, msg, first);
  throw_in_scope(Error(static_cast<ExitCode>(code), msg), scope);
}

void broadcast_string(MPI_Comm comm, std::string& s, int root) {
  if (comm_size(comm) == 1) return;
  std::int64_t n = static_cast<std::int64_t>(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT64_T, root, comm));
  s.resize(static_cast<std::size_t>(n));
  MPI_CHECK(MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, comm));
}

}  // namespace pdtrain
