# The CUDA backend for compute ranks (-DPDTRAIN_CUDA=ON): the CUDA device (src/device/cuda/)
# and the CUDA kernels with cuBLASLt GEMMs and cuDNN attention (src/kernels/cuda/, library
# pdtrain_kernels_cuda).
# Included by the top-level CMakeLists.txt before the parts are defined; it sets
#   PDTRAIN_DEVICE_EXTRA_SOURCES, PDTRAIN_DEVICE_EXTRA_DEPS  (the CUDA device joins pdtrain_device)
#   PDTRAIN_KERNELS_EXTRA_SOURCES, PDTRAIN_KERNELS_EXTRA_DEPS (pdtrain_kernels links the CUDA kernels)
# and defines pdtrain_kernels_cuda once pdtrain_device exists (pdtrain_cuda_kernels_library()).
#
# With -DPDTRAIN_CUDA_EMULATED=ON the same sources are built by the C++ compiler against the
# emulated CUDA target (cmake/PdtrainCudaEmulated.cmake, emulation/cuda/): a test tool, in a
# build directory of its own, never the production binary.
#
# Architectures: 90 (H100/H200) by default; e.g. -DCMAKE_CUDA_ARCHITECTURES="80;90" adds A100.
# nvcc and its host compiler: the C++ compiler of the rest of the build, unless
# CMAKE_CUDA_HOST_COMPILER says otherwise.

if(PDTRAIN_CUDA_EMULATED)
  include(PdtrainCudaEmulated)
else()
  include(PdtrainCudaToolkit)
endif()

set(PDTRAIN_DEVICE_EXTRA_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/cuda_device.cpp)
set(PDTRAIN_DEVICE_EXTRA_DEPS CUDA::cudart_static)

# NCCL between compute ranks' GPUs (src/device/cuda/nccl_collectives.cpp), when the toolkit (or
# NCCL_ROOT) has it; without it parallel.comm = "nccl" is an error and "auto" picks MPI. The
# binary then needs libnccl.so.2 at run time (the machine's, like cuBLASLt):
# -DPDTRAIN_WITH_NCCL=OFF builds without it for a machine that has none.
option(PDTRAIN_WITH_NCCL "NCCL between GPU compute ranks (when the toolkit has it)" ON)
# The NCCL collectives' one kernel (the fixed-order sum) is a .cu of the device library.
set(_pdt_nccl_sources ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/nccl_collectives.cpp
                      ${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/fixed_order_sum.cu)
if(PDTRAIN_CUDA_EMULATED)
  # The emulation's NCCL (over MPI) is pdtrain::nccl already; the .cu is C++ there.
  set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/src/device/cuda/fixed_order_sum.cu
                              PROPERTIES LANGUAGE CXX
                              COMPILE_OPTIONS "${PDTRAIN_CUDA_EMU_PROFILE_FLAGS}")
  list(APPEND PDTRAIN_DEVICE_EXTRA_SOURCES ${_pdt_nccl_sources})
  set(PDTRAIN_NCCL ON)
else()
find_path(PDTRAIN_NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(PDTRAIN_NCCL_LIBRARY nccl
             HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(PDTRAIN_WITH_NCCL AND PDTRAIN_NCCL_INCLUDE_DIR AND PDTRAIN_NCCL_LIBRARY)
  message(STATUS "pdtrain: NCCL from ${PDTRAIN_NCCL_LIBRARY}")
  add_library(pdtrain::nccl UNKNOWN IMPORTED)
  set_target_properties(pdtrain::nccl PROPERTIES IMPORTED_LOCATION ${PDTRAIN_NCCL_LIBRARY}
                                                 INTERFACE_INCLUDE_DIRECTORIES ${PDTRAIN_NCCL_INCLUDE_DIR})
  list(APPEND PDTRAIN_DEVICE_EXTRA_SOURCES ${_pdt_nccl_sources})
  list(APPEND PDTRAIN_DEVICE_EXTRA_DEPS pdtrain::nccl)
  set(PDTRAIN_NCCL ON)
else()
  message(STATUS "pdtrain: no NCCL (not found, or PDTRAIN_WITH_NCCL=OFF; NCCL_ROOT points at one): "
                 "compute ranks talk over MPI only")
  list(APPEND PDTRAIN_DEVICE_EXTRA_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/src/device/no_nccl/nccl_absent.cpp)
  set(PDTRAIN_NCCL OFF)
endif()
endif()
set(PDTRAIN_KERNELS_EXTRA_SOURCES "")
set(PDTRAIN_KERNELS_EXTRA_DEPS pdtrain_kernels_cuda)

# Warnings for both compilers: nvcc's own (with their numbers, e.g. 20011-D) and the host
# compiler's through -Xcompiler.
set(PDTRAIN_CUDA_WARNING_FLAGS
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra -Xcudafe=--display_error_number>)

# The CUDA kernels and the CUDA KernelOps. A library of its own so that nvcc never sees the
# flags of Kokkos or oneDNN (it links neither); never MPI: its checked calls end the job through
# pdtrain::fatal_abort (core/error.hpp), which the final link provides.
function(pdtrain_cuda_kernels_library)
  file(GLOB srcs CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/cuda/*.cu
                                   ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/cuda/*.cpp)
  add_library(pdtrain_kernels_cuda STATIC ${srcs})
  target_include_directories(pdtrain_kernels_cuda PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/include
                                                         ${CMAKE_CURRENT_BINARY_DIR}/generated)
  target_link_libraries(pdtrain_kernels_cuda PUBLIC pdtrain_device CUDA::cudart_static
                                                    CUDA::cublasLt CUDA::cublas pdtrain::cudnn)
  target_compile_options(pdtrain_kernels_cuda PRIVATE ${PDTRAIN_CUDA_WARNING_FLAGS})
  target_compile_definitions(pdtrain_kernels_cuda PRIVATE
                             PDTRAIN_CUDA_ARCH_LIST="${PDTRAIN_CUDA_ARCH_LIST}")
  # sum_losses must add in double exactly as the CPU loop does: no contraction anywhere in
  # the cross-entropy file (the kernel also spells its additions as __dadd_rn).
  # The optimizer step likewise: its values must be the CPU holders' bits.
  if(PDTRAIN_CUDA_EMULATED)
    # The .cu files as C++ (CMake adds -x c++); the host compiler never contracts anyway.
    list(FILTER srcs INCLUDE REGEX "\\.cu$")
    set_source_files_properties(${srcs} PROPERTIES LANGUAGE CXX
                                COMPILE_OPTIONS "${PDTRAIN_CUDA_EMU_PROFILE_FLAGS}")
    target_compile_options(pdtrain_kernels_cuda PRIVATE -Wno-unknown-pragmas)
  else()
    set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/cuda/crossentropy.cu
                                ${CMAKE_CURRENT_SOURCE_DIR}/src/kernels/cuda/optimizer.cu
                                PROPERTIES COMPILE_OPTIONS "--fmad=false")
  endif()
endfunction()
