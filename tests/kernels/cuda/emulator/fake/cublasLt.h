// The two names device_memory.cu takes from cublasLt.h (a status type and its name/message
// functions, for KTUNE_CUBLAS_CHECK's error text), so that file compiles on the host emulator.
// It deliberately fakes no cuBLASLt function: the GEMM-based kernels (gemm, attention_gemm,
// cross_entropy, nf4 linear, the decoder) are not emulated.
#pragma once

enum cublasStatus_t { CUBLAS_STATUS_SUCCESS = 0 };
inline const char* cublasLtGetStatusName(cublasStatus_t) { return "CUBLAS_STATUS_(emulator: no cuBLASLt)"; }
inline const char* cublasLtGetStatusString(cublasStatus_t) { return "cuBLASLt is not emulated"; }
