#pragma once
// MPI_CHECK wraps every MPI call: a failure reports file, line, rank and MPI's own message
// and ends the whole job (MPI_ERRORS_RETURN is set on the communicators we create).
#include <mpi.h>

#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain {
[[noreturn]] void mpi_fail(int rc, const char* call, const char* file, int line);
// MPI_Init_thread asking for MPI_THREAD_MULTIPLE (the PD fetch thread needs it; everything
// else works with less). Returns the level provided.
int init_mpi(int* argc, char*** argv);
int world_rank();  // rank in MPI_COMM_WORLD, or -1 before MPI_Init / after MPI_Finalize
int comm_size(MPI_Comm comm);  // checked MPI_Comm_size
int comm_rank(MPI_Comm comm);  // checked MPI_Comm_rank
}  // namespace pdtrain

#define MPI_CHECK(call)                                                   \
  do {                                                                    \
    int pdt_mpi_rc_ = (call);                                             \
    if (pdt_mpi_rc_ != MPI_SUCCESS)                                       \
      ::pdtrain::mpi_fail(pdt_mpi_rc_, #call, __FILE__, __LINE__);        \
  } while (0)
