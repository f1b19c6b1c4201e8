// Host emulation of the part of cuBLASLt that kernels/cuda/gemm.cu calls, so that gemm.cu's real
// source — its mapping of ktune's row-major GemmCall onto cuBLASLt's column-major layouts, its
// descriptors, preferences and plan cache — runs under the emulator and is tested against the CPU
// (gemm_test.cpp, and every GEMM of the decoder step, the fused loss and the GEMM attention path).
// cublaslt_on_host.cpp computes what NVIDIA documents (cublasLt.h's comments, CUDA 13):
//
//   D = alpha op(A) op(B) + beta C (+ bias), column-major: element (i, j) of a layout (rows, cols, ld)
//   at i + j ld, + b * STRIDED_BATCH_OFFSET for the b-th of BATCH_COUNT products; op(A) is (m, k),
//   op(B) (k, n), C and D (m, n); CUBLASLT_EPILOGUE_BIAS adds a packed vector of D's rows (m) to every
//   column, in D's type unless BIAS_DATA_TYPE says otherwise; beta == 0 never reads C.
//
// with f32 products summed in order (CUBLAS_COMPUTE_32F: no TF32 for f32 inputs) and D rounded to
// bf16 to nearest even. What it refuses, as the library does: descriptor attributes whose size is
// not the attribute's (CUBLAS_STATUS_INVALID_VALUE); layouts that do not fit the operation (op(A)'s
// and op(B)'s shapes against D's, C's against D's, ld < rows, batch counts that differ: INVALID_VALUE);
// type combinations cuBLASLt has no kernel for under CUBLAS_COMPUTE_32F (f32 A with a bf16 D, mixed A
// and B, a bias type other than D's: the heuristic returns no algorithm). What it ends the run for
// (emu::fail), being undefined on a GPU: a matmul with an algorithm the heuristic returned for
// another problem (other shapes, types, transposes, epilogue or batch), with a pointer (A, B, C, D,
// each product of a batch, the bias) less aligned than the heuristic was told (the preferences'
// MIN_ALIGNMENT_*; the bias's from its pointer at the heuristic, as cublasLt.h says the heuristic
// reads it), with less workspace than the algorithm asked for, a D overlapping A or B, or an
// in-place C == D whose layouts differ.
// It deliberately emulates nothing else of cuBLASLt: no other compute, scale or data types, no
// epilogue but BIAS, no pointer mode but host, no row-major orders, no pointer-array batches; an
// attribute it does not know ends the run, so code that starts using one cannot pass unemulated.
// Nor does it say anything of cuBLASLt's speed, its algorithms' summation order or its own bugs.
#pragma once
#include <cstddef>
#include <cstdint>

enum cublasStatus_t {
  CUBLAS_STATUS_SUCCESS = 0,
  CUBLAS_STATUS_NOT_INITIALIZED = 1,
  CUBLAS_STATUS_ALLOC_FAILED = 3,
  CUBLAS_STATUS_INVALID_VALUE = 7,
  CUBLAS_STATUS_ARCH_MISMATCH = 8,
  CUBLAS_STATUS_EXECUTION_FAILED = 13,
  CUBLAS_STATUS_INTERNAL_ERROR = 14,
  CUBLAS_STATUS_NOT_SUPPORTED = 15,
};

// library_types.h's (the values are NVIDIA's).
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16F = 2, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_OP_C = 2 };

enum cublasLtMatmulDescAttributes_t {
  CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0,
  CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1,
  CUBLASLT_MATMUL_DESC_POINTER_MODE = 2,
  CUBLASLT_MATMUL_DESC_TRANSA = 3,
  CUBLASLT_MATMUL_DESC_TRANSB = 4,
  CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
  CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10,
  CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
};
enum cublasLtEpilogue_t { CUBLASLT_EPILOGUE_DEFAULT = 1, CUBLASLT_EPILOGUE_BIAS = 4 };

enum cublasLtMatrixLayoutAttribute_t {
  CUBLASLT_MATRIX_LAYOUT_TYPE = 0,
  CUBLASLT_MATRIX_LAYOUT_ORDER = 1,
  CUBLASLT_MATRIX_LAYOUT_ROWS = 2,
  CUBLASLT_MATRIX_LAYOUT_COLS = 3,
  CUBLASLT_MATRIX_LAYOUT_LD = 4,
  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5,
  CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6,
};
enum cublasLtOrder_t { CUBLASLT_ORDER_COL = 0 };

enum cublasLtMatmulPreferenceAttributes_t {
  CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
  CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
};

struct cublasLtContext;
struct cublasLtMatmulDescOpaque_t;
struct cublasLtMatrixLayoutOpaque_t;
struct cublasLtMatmulPreferenceOpaque_t;
using cublasLtHandle_t = cublasLtContext*;
using cublasLtMatmulDesc_t = cublasLtMatmulDescOpaque_t*;
using cublasLtMatrixLayout_t = cublasLtMatrixLayoutOpaque_t*;
using cublasLtMatmulPreference_t = cublasLtMatmulPreferenceOpaque_t*;

struct cublasLtMatmulAlgo_t {  // semi-opaque, as in cublasLt.h; here data[0] names the heuristic's problem
  uint64_t data[8];
};
struct cublasLtMatmulHeuristicResult_t {
  cublasLtMatmulAlgo_t algo;
  size_t workspaceSize;
  cublasStatus_t state;
  float wavesCount;
  int reserved[4];
};

struct CUstream_st;

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle);
cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle);
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale);
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes);
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc);
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld);
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes);
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout);
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref);
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes);
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref);
cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned);
cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              CUstream_st* stream);
const char* cublasLtGetStatusName(cublasStatus_t status);
const char* cublasLtGetStatusString(cublasStatus_t status);
