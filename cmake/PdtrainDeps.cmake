# Finds pdtrain's dependencies and gives each one a pdtrain:: target, so the rest of the
# build does not care whether it came from Debian's packages, a module or Spack.

find_package(MPI REQUIRED COMPONENTS CXX)
find_package(toml11 REQUIRED)
find_package(nlohmann_json 3 REQUIRED)  # safetensors headers and config.json (interop/)
find_package(GTest)

# --- Kokkos: a standalone Kokkos >= 4 (OpenMP/CUDA, clusters) through Kokkos::kokkos;
# otherwise Debian's Trilinos Kokkos 3.4 (Serial), whose Kokkos::kokkos target has a bad
# include directory, through its libraries directly.
find_package(Kokkos 4.0 CONFIG QUIET)
add_library(pdtrain::kokkos INTERFACE IMPORTED GLOBAL)
if(Kokkos_FOUND)
  message(STATUS "pdtrain: Kokkos ${Kokkos_VERSION} (standalone) via Kokkos::kokkos")
  target_link_libraries(pdtrain::kokkos INTERFACE Kokkos::kokkos)
else()
  find_path(PDTRAIN_KOKKOS_INCLUDE Kokkos_Core.hpp PATHS /usr/include/trilinos REQUIRED)
  find_library(PDTRAIN_KOKKOSCORE_LIB trilinos_kokkoscore REQUIRED)
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

# --- oneDNN (optional), the default GEMM backend when found; PDTRAIN_GEMM_BACKEND picks.
# Debian's dnnl-config.cmake (built with an OpenCL GPU runtime) calls find_package(OpenCL
# REQUIRED), a hard configure error without the OpenCL headers, which the CPU matmul never
# needs: the config is tried only when OpenCL is there, else the header and library directly.
find_package(OpenCL QUIET)
if(OpenCL_FOUND)
  find_package(dnnl CONFIG QUIET)
endif()
find_path(PDTRAIN_DNNL_INCLUDE oneapi/dnnl/dnnl.hpp)
if(dnnl_FOUND AND TARGET DNNL::dnnl)
  set(PDTRAIN_DNNL_LINK DNNL::dnnl)
else()
  find_library(PDTRAIN_DNNL_LIB dnnl)
  if(PDTRAIN_DNNL_INCLUDE AND PDTRAIN_DNNL_LIB)
    set(PDTRAIN_DNNL_LINK ${PDTRAIN_DNNL_LIB})
  endif()
endif()
if(PDTRAIN_DNNL_LINK AND PDTRAIN_DNNL_INCLUDE)
  file(STRINGS ${PDTRAIN_DNNL_INCLUDE}/oneapi/dnnl/dnnl_version.h _dnnl_ver
       REGEX "#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
  string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3"
         PDTRAIN_DNNL_VERSION "${_dnnl_ver}")
  add_library(pdtrain::onednn INTERFACE IMPORTED GLOBAL)
  target_include_directories(pdtrain::onednn SYSTEM INTERFACE ${PDTRAIN_DNNL_INCLUDE})
  target_link_libraries(pdtrain::onednn INTERFACE ${PDTRAIN_DNNL_LINK})
  # With the OpenMP threading runtime the backend sets oneDNN's thread count through the
  # OpenMP API (omp_set_num_threads), so it links the runtime itself (no -fopenmp needed).
  file(STRINGS ${PDTRAIN_DNNL_INCLUDE}/oneapi/dnnl/dnnl_config.h _dnnl_omp
       REGEX "#define DNNL_CPU_THREADING_RUNTIME DNNL_RUNTIME_OMP")
  if(_dnnl_omp)
    find_package(OpenMP REQUIRED COMPONENTS CXX)
    target_link_libraries(pdtrain::onednn INTERFACE ${OpenMP_CXX_LIBRARIES})
  endif()
  set(_gemm_default onednn)
else()
  set(_gemm_default blas)
endif()
set(PDTRAIN_GEMM_BACKEND ${_gemm_default} CACHE STRING "GEMM backend: onednn or blas")
set_property(CACHE PDTRAIN_GEMM_BACKEND PROPERTY STRINGS onednn blas)
# pdtrain::gemm_backend: what pdtrain_kernels links for its GEMMs (BLAS is linked either way,
# for the fp64 GEMMs and blas_runtime).
add_library(pdtrain::gemm_backend INTERFACE IMPORTED GLOBAL)
if(PDTRAIN_GEMM_BACKEND STREQUAL "onednn")
  if(NOT TARGET pdtrain::onednn)
    message(FATAL_ERROR "pdtrain: PDTRAIN_GEMM_BACKEND=onednn but oneDNN (dnnl) was not found")
  endif()
  target_link_libraries(pdtrain::gemm_backend INTERFACE pdtrain::onednn)
  target_compile_definitions(pdtrain::gemm_backend INTERFACE PDTRAIN_GEMM_ONEDNN)
  message(STATUS "pdtrain: GEMM backend oneDNN ${PDTRAIN_DNNL_VERSION} (${PDTRAIN_DNNL_LINK})")
elseif(PDTRAIN_GEMM_BACKEND STREQUAL "blas")
  if(TARGET pdtrain::onednn)
    message(STATUS "pdtrain: GEMM backend CBLAS (oneDNN ${PDTRAIN_DNNL_VERSION} found, not used)")
  else()
    message(STATUS "pdtrain: GEMM backend CBLAS (oneDNN not found)")
  endif()
else()
  message(FATAL_ERROR "pdtrain: PDTRAIN_GEMM_BACKEND must be onednn or blas, not "
                      "'${PDTRAIN_GEMM_BACKEND}'")
endif()

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
