#pragma once
// The emulated CUDA target's cublas_v2.h (a test tool: never in the production pdtrain): as in
// NVIDIA's header, the cuBLAS API of cublas_api.h with the plain names mapped onto the _v2
// entry points.
#include <cublas_api.h>

#define cublasCreate cublasCreate_v2
#define cublasDestroy cublasDestroy_v2
#define cublasGetVersion cublasGetVersion_v2
#define cublasSetWorkspace cublasSetWorkspace_v2
#define cublasSetStream cublasSetStream_v2
#define cublasGetStream cublasGetStream_v2
#define cublasGetPointerMode cublasGetPointerMode_v2
#define cublasSetPointerMode cublasSetPointerMode_v2
