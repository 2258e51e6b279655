#pragma once
// CUDNN_CHECK(call): a cuDNN call that must succeed (the handle, executing a plan that was
// built): a failure is a fault only this rank sees, so pdtrain::fatal_abort prints file, line,
// rank and cuDNN's status and ends the job, as CUBLAS_CHECK does. Building a graph is not
// checked this way: cuDNN refusing a shape is an answer (cudnn_sdpa.cpp), not a fault.
#include <cudnn.h>

#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"

namespace pdtrain {

[[noreturn]] inline void cudnn_fail(cudnnStatus_t rc, const char* call, const char* file,
                                    int line) {
  fatal_abort(ExitCode::runtime, where(file, line) + ": " + call + " failed: " +
                                     cudnnGetErrorString(rc) + " (status " +
                                     std::to_string(static_cast<int>(rc)) + ")");
}

}  // namespace pdtrain

#define CUDNN_CHECK(call) \
  PDTRAIN_CHECKED_CALL(call, cudnnStatus_t, CUDNN_STATUS_SUCCESS, ::pdtrain::cudnn_fail)
