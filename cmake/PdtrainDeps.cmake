# Finds pdtrain's dependencies and gives each one a pdtrain:: target, so the rest of the
# build does not care whether it came from Debian's packages, a module or Spack.

find_package(MPI REQUIRED COMPONENTS CXX)
find_package(toml11 REQUIRED)
find_package(GTest)

# --- Kokkos: a standalone Kokkos >= 4 (OpenMP/CUDA, clusters) through Kokkos::kokkos;
# otherwise Debian's Trilinos Kokkos 3.4 (Serial), whose Kokkos::kokkos target has a bad
# include directory, through its libraries directly.
find_package(Kokkos 4.0 CONFIG QUIET)
add_library(pdtrain::kokkos INTERFACE IMPORTED GLOBAL)
if(Kokkos_FOUND)
  message(STATUS "pdtrain: Kokkos ${Kokkos_VERSION} (standalone) via Kokkos::kokkos")
  target_link_libraries(pdtrain::kokkos INTERFACE Kokkos::kokkos)
  find_package(KokkosKernels CONFIG QUIET)
else()
  find_path(PDTRAIN_KOKKOS_INCLUDE Kokkos_Core.hpp PATHS /usr/include/trilinos REQUIRED)
  find_library(PDTRAIN_KOKKOSCORE_LIB trilinos_kokkoscore REQUIRED)
  find_library(PDTRAIN_KOKKOSKERNELS_LIB trilinos_kokkoskernels)
  message(STATUS "pdtrain: Trilinos Kokkos from ${PDTRAIN_KOKKOS_INCLUDE}")
  target_include_directories(pdtrain::kokkos SYSTEM INTERFACE ${PDTRAIN_KOKKOS_INCLUDE})
  target_link_libraries(pdtrain::kokkos INTERFACE ${PDTRAIN_KOKKOSCORE_LIB} ${CMAKE_DL_LIBS})
endif()

# --- BLAS with the CBLAS interface (OpenBLAS on Debian).
set(BLA_VENDOR OpenBLAS)
find_package(BLAS)
if(NOT BLAS_FOUND)
  unset(BLA_VENDOR)
  find_package(BLAS REQUIRED)
endif()
find_path(PDTRAIN_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas REQUIRED)
add_library(pdtrain::blas INTERFACE IMPORTED GLOBAL)
target_link_libraries(pdtrain::blas INTERFACE BLAS::BLAS)
target_include_directories(pdtrain::blas SYSTEM INTERFACE ${PDTRAIN_CBLAS_INCLUDE})

# --- ISA-L for CRC32C.
find_path(PDTRAIN_ISAL_INCLUDE isa-l/crc.h REQUIRED)
find_library(PDTRAIN_ISAL_LIB isal REQUIRED)
add_library(pdtrain::isal INTERFACE IMPORTED GLOBAL)
target_include_directories(pdtrain::isal SYSTEM INTERFACE ${PDTRAIN_ISAL_INCLUDE})
target_link_libraries(pdtrain::isal INTERFACE ${PDTRAIN_ISAL_LIB})

# --- zstd and lz4 (wire and checkpoint codecs).
find_package(PkgConfig REQUIRED)
pkg_check_modules(PDTRAIN_ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(PDTRAIN_LZ4 REQUIRED IMPORTED_TARGET liblz4)
add_library(pdtrain::zstd ALIAS PkgConfig::PDTRAIN_ZSTD)
add_library(pdtrain::lz4 ALIAS PkgConfig::PDTRAIN_LZ4)

# --- How tests launch MPI programs here (root in containers, more ranks than cores).
set(PDTRAIN_MPIEXEC ${MPIEXEC_EXECUTABLE} CACHE STRING "MPI launcher used by the tests")
set(PDTRAIN_MPIEXEC_FLAGS --oversubscribe --mca mpi_yield_when_idle 1 --bind-to none
    CACHE STRING "Launcher flags used by the tests")
