// Error checking for the CUDA backend: every CUDA runtime and cuBLAS(Lt) call goes through
// KTUNE_CUDA_CHECK / KTUNE_CUBLAS_CHECK, which turn a failure into ktune::Error with the file:line
// of the call as `where` and the library's own name and message of the code as `what`.
// Kernel launches are checked with KTUNE_CUDA_CHECK_LAUNCH() right after the <<<>>> (launch
// configuration errors; faults inside a kernel surface at the next synchronising call).
// It deliberately does not synchronise after each launch (that would serialise the stream).
#pragma once

namespace ktune::cuda {

// Throw ktune::Error("file:line", "<expr>: <name> (<message>)"). code is a cudaError_t / cublasStatus_t.
[[noreturn]] void throw_cuda_error(int code, const char* expr, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* expr, const char* file, int line);

}  // namespace ktune::cuda

#define KTUNE_CUDA_CHECK(expr)                                                              \
  do {                                                                                      \
    int ktune_cuda_rc_ = static_cast<int>(expr);                                            \
    if (ktune_cuda_rc_ != 0) ::ktune::cuda::throw_cuda_error(ktune_cuda_rc_, #expr, __FILE__, __LINE__); \
  } while (0)

#define KTUNE_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                      \
    int ktune_cublas_rc_ = static_cast<int>(expr);                                          \
    if (ktune_cublas_rc_ != 0)                                                              \
      ::ktune::cuda::throw_cublas_error(ktune_cublas_rc_, #expr, __FILE__, __LINE__);       \
  } while (0)

#define KTUNE_CUDA_CHECK_LAUNCH() KTUNE_CUDA_CHECK(cudaGetLastError())
