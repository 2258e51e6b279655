// GoogleTest main for MPI tests: every rank runs every test; only rank 0 prints results, and
// the exit status is non-zero on every rank if any rank failed.
// Built with PDTRAIN_TEST_NEEDS_GPU (the MPI tests of a CUDA build, ctest label gpu): when any
// rank sees no GPU, every rank exits 77 without running a test, which ctest reports as skipped
// (SKIP_RETURN_CODE), never as passed.
#include <mpi.h>

#include "pdtrain/core/mpi_check.hpp"
#ifdef PDTRAIN_TEST_NEEDS_GPU
#include <cstdio>

#include "pdtrain/kernels/kernel_ops.hpp"
#endif

#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  pdtrain::init_mpi(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
#ifdef PDTRAIN_TEST_NEEDS_GPU
  int gpus = pdtrain::kernels::cuda_device_count(), fewest = 0;
  MPI_Allreduce(&gpus, &fewest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (fewest == 0 && !::testing::GTEST_FLAG(list_tests)) {
    if (rank == 0) std::printf("%s: no GPU is visible: every GPU test skipped\n", argv[0]);
    MPI_Finalize();
    return 77;
  }
#endif
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  Kokkos::initialize(argc, argv);
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0, any = 0;
  MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  Kokkos::finalize();
  MPI_Finalize();
  return any;
}
