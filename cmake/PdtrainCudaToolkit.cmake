# The real CUDA toolkit for the CUDA backend (included by PdtrainCuda.cmake): nvcc, the
# architectures, C++20 for CUDA, and the imported targets CUDA::cudart_static, CUDA::cublasLt,
# CUDA::cublas; NCCL is found by PdtrainCuda.cmake.
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
if(NOT DEFINED CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER})
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  message(FATAL_ERROR "pdtrain: PDTRAIN_CUDA=ON but no CUDA compiler was found: put nvcc on PATH "
                      "(e.g. /usr/local/cuda/bin) or set CMAKE_CUDA_COMPILER, or configure with "
                      "-DPDTRAIN_CUDA=OFF for the CPU-only binary")
endif()
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)
# CMake before 3.26 does not know nvcc's C++20 flag (nvcc has it since CUDA 12.0).
if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
endif()
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

# "sm_80, sm_90" for `pdtrain --version` (suffixes such as -real dropped).
set(_pdt_archs ${CMAKE_CUDA_ARCHITECTURES})
list(TRANSFORM _pdt_archs REPLACE "-(real|virtual)$" "")
list(TRANSFORM _pdt_archs PREPEND "sm_")
list(JOIN _pdt_archs ", " PDTRAIN_CUDA_ARCH_LIST)
message(STATUS "pdtrain: CUDA backend with CUDA ${CUDAToolkit_VERSION} for ${PDTRAIN_CUDA_ARCH_LIST}")

