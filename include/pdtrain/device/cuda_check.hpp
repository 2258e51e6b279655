#pragma once
// CUDA_CHECK(call): a failed CUDA runtime call is a fault only this rank sees, so it ends the
// whole job at once (pdtrain::fatal_abort prints "pdtrain: error (rank R): file:line: call
// failed: <cudaGetErrorString>" and aborts every rank). For CUDA code only (the CUDA device and
// the CUDA kernels); neither links MPI: fatal_abort is core's and the final link provides it.
//
// CUDA_CHECK_LAUNCH(): after a kernel launch, catches a bad launch configuration at once.
// Faults inside a kernel surface at the next synchronizing call (checked the same way).
#include <cuda_runtime_api.h>

#include <string>

#include "pdtrain/core/error.hpp"

namespace pdtrain {

[[noreturn]] inline void cuda_fail(cudaError_t rc, const char* call, const char* file, int line) {
  fatal_abort(ExitCode::runtime, where(file, line) + ": " + call + " failed: " +
                                     cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
}

}  // namespace pdtrain

// Checks a call that returns a status of `type`; any status but `ok` goes to fail(status, call
// text, file, line), which does not return.
#define PDTRAIN_CHECKED_CALL(call, type, ok, fail)                                 \
  do {                                                                             \
    const type pdtrain_status_ = (call);                                           \
    if (pdtrain_status_ != (ok)) fail(pdtrain_status_, #call, __FILE__, __LINE__); \
  } while (0)

#define CUDA_CHECK(call) PDTRAIN_CHECKED_CALL(call, cudaError_t, cudaSuccess, ::pdtrain::cuda_fail)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
