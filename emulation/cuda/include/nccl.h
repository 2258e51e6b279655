#pragma once
// The emulated CUDA target's NCCL (a test tool: never in the production pdtrain). The subset of
// NVIDIA's nccl.h (NCCL 2.28) that pdtrain calls, with NCCL's names, values and documented
// semantics, implemented over MPI on the emulated device memory by emulation/cuda/src/nccl.cpp.
//
// What differs from NCCL, on purpose:
//  - Communicators are made over MPI_COMM_WORLD (MPI_Init_thread with MPI_THREAD_MULTIPLE must
//    have run): one rank per process and communicator, and the process that called
//    ncclGetUniqueId must itself be a member of the communicator made from its id.
//  - Every communicator is blocking (NCCL's default): ncclCommGetAsyncError never answers
//    ncclInProgress, only ncclSuccess or the error that broke the communicator.
//  - Buffers are checked when the call is made: they must be device memory of the
//    communicator's GPU (or pinned host memory) holding the whole extent, where NCCL checks
//    nothing by default (NCCL_CHECK_POINTERS=0) and a bad pointer faults its kernel.
//  - Sums are the same bits on every rank and every run: contributions are added in rank order
//    0, 1, 2, ... (floating types narrower than float widened to float, rounded once at the
//    end); ncclAvg is the sum divided by the rank count. NCCL's ring adds in its own order.
//  - Queued work waiting on a peer gives up after PDTRAIN_CUDA_EMU_NCCL_TIMEOUT seconds (default
//    600; 0: never) or once the communicator is aborted: the work ends with an error on the
//    communicator (ncclCommGetAsyncError) and a fault of its stream's device.
//  - ncclFloat8e4m3 / ncclFloat8e5m2 are refused (ncclInvalidArgument).
#include <cuda_runtime_api.h>

#include <climits>
#include <cstddef>

#define PDTRAIN_NCCL_EMULATED 1

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 3
#define NCCL_SUFFIX ""

#define NCCL_VERSION_CODE 22803
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X)*1000 + (Y)*100 + (Z) : (X)*10000 + (Y)*100 + (Z))

extern "C" {

// Opaque handle to a communicator.
typedef struct ncclComm* ncclComm_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  ncclNumOps = 5,
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0,
  ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclHalf = 6,
  ncclFloat32 = 7,
  ncclFloat = 7,
  ncclFloat64 = 8,
  ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

// Version (NCCL_VERSION_CODE), ids and communicators.
ncclResult_t ncclGetVersion(int* version);
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
// Collective over the communicator's nranks processes, each with its own rank and the same
// commId; the communicator's GPU is the calling thread's current device.
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
// Waits for the communicator's queued work, then frees it.
ncclResult_t ncclCommDestroy(ncclComm_t comm);
// Ends the communicator's queued work (with an error where it had not finished), then frees it.
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);

const char* ncclGetErrorString(ncclResult_t result);
// The last error's message (of any communicator: comm is unused, as in NCCL). Not cleared.
const char* ncclGetLastError(ncclComm_t comm);

// Collectives and point-to-point operations: checked when called, then queued on `stream`.
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);

// Group semantics (per host thread; groups nest): the calls made inside are checked when made
// and queued at the outermost ncclGroupEnd, one unit per stream.
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();

}  // extern "C"
