#pragma once
// Checked calls for the CUDA kernels: CUDA_CHECK and CUDA_CHECK_LAUNCH (the CUDA runtime, from
// device/cuda_check.hpp) and CUBLAS_CHECK (cuBLASLt). A failure is a fault only this rank sees:
// pdtrain::fatal_abort prints file, line, rank and the library's own message and ends the job.
#include <cublasLt.h>

#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"

namespace pdtrain {

[[noreturn]] inline void cublas_fail(cublasStatus_t rc, const char* call, const char* file,
                                     int line) {
  fatal_abort(ExitCode::runtime, where(file, line) + ": " + call +
                                     " failed: " + cublasLtGetStatusString(rc) + " (status " +
                                     std::to_string(static_cast<int>(rc)) + ")");
}

}  // namespace pdtrain

#define CUBLAS_CHECK(call) \
  PDTRAIN_CHECKED_CALL(call, cublasStatus_t, CUBLAS_STATUS_SUCCESS, ::pdtrain::cublas_fail)
