#include "pdtrain/core/error.hpp"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "pdtrain/core/mpi_check.hpp"

namespace pdtrain {

int init_mpi(int* argc, char*** argv) {
  int provided = MPI_THREAD_SINGLE;
  MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  return provided;
}

int world_rank() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return -1;
  int r = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int comm_size(MPI_Comm comm) {
  int n = 0;
  MPI_CHECK(MPI_Comm_size(comm, &n));
  return n;
}

int comm_rank(MPI_Comm comm) {
  int r = 0;
  MPI_CHECK(MPI_Comm_rank(comm, &r));
  return r;
}

std::string where(const char* file, int line) {
  return std::string(file) + ":" + std::to_string(line);
}

void fatal_abort(ExitCode code, const std::string& msg) {
  const int r = world_rank();
  std::fprintf(stderr, "pdtrain: error (rank %d): %s\n", r, msg.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  if (r >= 0) MPI_Abort(MPI_COMM_WORLD, static_cast<int>(code));
  std::_Exit(static_cast<int>(code));
}

void mpi_fail(int rc, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fatal_abort(ExitCode::runtime,
              where(file, line) + ": " + call + " failed: " + std::string(text, len));
}

}  // namespace pdtrain
