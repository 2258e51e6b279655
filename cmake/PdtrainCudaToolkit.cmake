# The real CUDA toolkit for the CUDA backend (included by PdtrainCuda.cmake): nvcc, the
# architectures, C++20 for CUDA, the imported targets CUDA::cudart_static, CUDA::cublasLt,
# CUDA::cublas, and pdtrain::cudnn (cuDNN 9, in the toolkit's tree or CUDNN_ROOT); NCCL is found
# by PdtrainCuda.cmake.
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


# cuDNN (the attention family's fused attention, src/kernels/cuda/cudnn_sdpa.cpp): its graph API
# is in libcudnn.so.9 (which loads its engine libraries itself). The binary then needs
# libcudnn.so.9 at run time, like cuBLASLt: the toolkit's, or PyTorch's (nvidia-cudnn-cu12/13
# wheels) on LD_LIBRARY_PATH (scripts/gpu-check.sh).
find_path(PDTRAIN_CUDNN_INCLUDE_DIR cudnn_graph.h
          HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(PDTRAIN_CUDNN_LIBRARY cudnn
             HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(NOT PDTRAIN_CUDNN_INCLUDE_DIR OR NOT PDTRAIN_CUDNN_LIBRARY)
  message(FATAL_ERROR "pdtrain: the CUDA backend needs cuDNN 9 (cudnn_graph.h and libcudnn): "
                      "install it into the toolkit or point CUDNN_ROOT at it")
endif()
message(STATUS "pdtrain: cuDNN from ${PDTRAIN_CUDNN_LIBRARY}")
add_library(pdtrain::cudnn UNKNOWN IMPORTED)
set_target_properties(pdtrain::cudnn PROPERTIES IMPORTED_LOCATION ${PDTRAIN_CUDNN_LIBRARY}
                                                INTERFACE_INCLUDE_DIRECTORIES ${PDTRAIN_CUDNN_INCLUDE_DIR})
