// Host emulation of the NCCL API subset that ktune uses (src/dist/process_group_nccl.cpp), beside
// fake/cuda_runtime.h: the real process group compiles against it and runs, across processes on
// one host, with no GPU and no NCCL (fake/nccl.cpp; tests/kernels/cuda/emulator/CMakeLists.txt).
//
// Transport. The unique id names a POSIX shared-memory segment; every rank of the communicator maps
// it, and each collective goes through it in chunks: each rank copies its input chunk into its own
// slot, all meet at a barrier, each computes its output chunk from every slot, all meet again
// (the slots are then free for the next chunk). Sums run in the element dtype, in rank order
// (deterministic; real NCCL's order depends on its algorithm, so compare with a tolerance or with
// exactly representable values). The barriers are counters in the segment, polled, never blocking.
//
// What it checks, each an error code as real NCCL returns it (and a line on stderr saying why):
// ranks in range and agreeing on the world size, an initialised config, ncclSum only, the dtypes
// below, NCCL's in-place rules (reduce-scatter: recvbuff == sendbuff + rank*recvcount;
// all-gather: sendbuff == recvbuff + rank*sendcount; any other overlap of input and output is
// refused, where real NCCL would compute garbage), and, as an asynchronous ncclInvalidUsage, ranks
// that call different collectives (kind, count, dtype or root) at the same point, where real NCCL
// would hang or corrupt.
// Non-blocking communicators (config.blocking = 0) behave as NCCL documents they may: init returns
// ncclInProgress and completes, as ncclCommGetAsyncError reports, only once every rank has joined;
// every collective returns ncclInProgress and is put on its stream only by the next
// ncclCommGetAsyncError call, so a caller that waits for the stream before the communicator's state
// has left ncclInProgress waits for nothing (that is what NCCL allows, not what it usually does).
// On the stream a collective is an operation that waits for its peers (fake/cuda_runtime.h:
// cudaStreamQuery says cudaErrorNotReady until every rank has arrived; cudaStreamSynchronize blocks).
// A peer that never arrives, or dies, leaves it waiting, as real NCCL's kernel would: the caller's
// timeout must end it (ncclCommAbort abandons it). A peer's ncclCommAbort shows as ncclRemoteError.
//
// It cannot emulate NCCL's transports (NVLink, PCIe P2P, InfiniBand, sockets), its algorithms
// (rings, trees, NVLS) and their summation order, asynchronous progress (nothing runs until the
// host polls), several ranks in one process sharing a CUDA device, ncclGroupStart/End, or any call
// or dtype ktune does not use (no half / bf16 / fp8 reductions; all-gather and broadcast copy any).
// It is not thread-safe (one thread a process calls it, as ktune's group does). A rank killed by a
// signal leaves its segment's name in /dev/shm if init had not finished (16 MiB, sparse).
#pragma once
#include <climits>
#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION(X, Y, Z) ((X)*10000 + (Y)*100 + (Z))
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

typedef struct ncclComm* ncclComm_t;
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

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
// The fields ktune could set; NCCL_CONFIG_INITIALIZER's size and magic are checked as NCCL does.
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
  int splitShare;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER                                                                                \
  {                                                                                                            \
    sizeof(ncclConfig_t), 0xcafebeef, NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), NCCL_CONFIG_UNDEF_INT, \
        NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_PTR,            \
        NCCL_CONFIG_UNDEF_INT                                                                                  \
  }

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
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
  ncclNumTypes = 10
} ncclDataType_t;

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t result);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclCommCount(ncclComm_t comm, int* count);
ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream);
