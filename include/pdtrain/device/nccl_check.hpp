#pragma once
// NCCL_CHECK(call): a failed NCCL call is a fault only this rank sees, so it ends the whole job
// at once through pdtrain::fatal_abort ("pdtrain: error (rank R): file:line: call failed:
// <ncclGetErrorString> (<ncclGetLastError>)"), as CUDA_CHECK does. For NCCL code only.
#include <nccl.h>

#include <string>

#include "pdtrain/core/error.hpp"
#include "pdtrain/device/cuda_check.hpp"

namespace pdtrain {

[[noreturn]] inline void nccl_fail(ncclResult_t rc, const char* call, const char* file, int line) {
  const char* last = ncclGetLastError(nullptr);
  fatal_abort(ExitCode::runtime, where(file, line) + ": " + call + " failed: " +
                                     ncclGetErrorString(rc) +
                                     (last && *last ? std::string(" (") + last + ")" : ""));
}

}  // namespace pdtrain

#define NCCL_CHECK(call) PDTRAIN_CHECKED_CALL(call, ncclResult_t, ncclSuccess, ::pdtrain::nccl_fail)
