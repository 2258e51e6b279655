# The emulated CUDA target (-DPDTRAIN_CUDA=ON -DPDTRAIN_CUDA_EMULATED=ON; included by
# PdtrainCuda.cmake instead of the toolkit): pdtrain's own .cu sources built by the C++ compiler
# against the emulation runtime in emulation/cuda/ (the CUDA runtime, cuBLASLt, cuBLAS, cuDNN and
# NCCL subsets pdtrain calls, on the CPU), so that every GPU code path runs in CI without a GPU.
# A test tool: configure it in a build directory of its own (scripts/build-cuda-emulated.sh);
# the production pdtrain is never linked against it, and an emulated run says "cuda (emulated
# on the CPU)" wherever a GPU run names its GPU.
#
# PDTRAIN_SANITIZE (default "address;undefined"): the sanitizers the whole emulated build is
# compiled with: an out-of-bounds access in a kernel is an AddressSanitizer report naming it,
# a misaligned vector access a UBSan report. Empty for a plain build.
set(PDTRAIN_SANITIZE "address;undefined" CACHE STRING "Sanitizers of the emulated CUDA build")
if(PDTRAIN_SANITIZE)
  list(JOIN PDTRAIN_SANITIZE "," _pdt_sanitizers)
  add_compile_options(-fsanitize=${_pdt_sanitizers} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${_pdt_sanitizers})
  message(STATUS "pdtrain: emulated CUDA target with -fsanitize=${_pdt_sanitizers}")
endif()

# PDTRAIN_CUDA_EMU_PROFILE (default OFF): the profiling build of the emulated target (a test
# tool like it; scripts/build-cuda-profile.sh): clang's -fsanitize-coverage=trace-loads and
# trace-stores on the kernel sources only (the .cu files, and the tests' planted kernels), so
# that every load and store of kernel code reaches the runtime's counters (emulation/cuda/src/
# profile.cpp, docs/cuda-emulation.md "Kernel counts"). GCC has no trace-loads: clang only.
option(PDTRAIN_CUDA_EMU_PROFILE "Count kernel memory accesses (clang coverage callbacks)" OFF)
set(PDTRAIN_CUDA_EMU_PROFILE_FLAGS "")
if(PDTRAIN_CUDA_EMU_PROFILE)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "PDTRAIN_CUDA_EMU_PROFILE needs clang (-fsanitize-coverage=trace-loads)")
  endif()
  set(PDTRAIN_CUDA_EMU_PROFILE_FLAGS -fsanitize-coverage=edge,trace-loads,trace-stores)
  add_compile_definitions(PDTRAIN_CUDA_EMU_PROFILE=1)
  message(STATUS "pdtrain: emulated CUDA target, profiling build (kernel loads and stores counted)")
endif()

find_package(Boost 1.74 REQUIRED COMPONENTS context)
find_package(Threads REQUIRED)

set(PDTRAIN_CUDA_ARCH_LIST "emulated on the CPU")
message(STATUS "pdtrain: CUDA backend on the emulated CUDA target (emulation/cuda, no GPU)")

file(GLOB _pdt_emulation_sources CONFIGURE_DEPENDS
     ${CMAKE_CURRENT_SOURCE_DIR}/emulation/cuda/src/*.cpp)
add_library(pdtrain_cuda_emulation STATIC ${_pdt_emulation_sources})
target_include_directories(pdtrain_cuda_emulation PUBLIC ${CMAKE_CURRENT_SOURCE_DIR}/emulation/cuda/include)
target_link_libraries(pdtrain_cuda_emulation PUBLIC Boost::context Threads::Threads MPI::MPI_CXX)
target_compile_options(pdtrain_cuda_emulation PRIVATE -Wall -Wextra)

# The toolkit's imported targets, as the rest of the build names them.
add_library(CUDA::cudart_static ALIAS pdtrain_cuda_emulation)
add_library(CUDA::cublasLt ALIAS pdtrain_cuda_emulation)
add_library(CUDA::cublas ALIAS pdtrain_cuda_emulation)
add_library(pdtrain::nccl ALIAS pdtrain_cuda_emulation)
add_library(pdtrain::cudnn ALIAS pdtrain_cuda_emulation)
