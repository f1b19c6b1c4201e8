// What the emulated kernels link against in place of kernels/cuda/gemm.cu: GemmContext and gemm_bf16
// refuse with a ktune::Error ("cuBLASLt is not emulated"), so that nf4.cu (whose NF4 linear runs a
// cuBLASLt GEMM after its dequantise kernel) and nf4_test.cpp link and the dequantise case runs.
// A case that reaches a GEMM fails loudly here; CMakeLists.txt leaves those cases out of CTest.
// It deliberately computes nothing: faking cuBLASLt would test the fake, not the kernels.
#include <memory>

#include "core/error.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

struct GemmContext::State {};

GemmContext::GemmContext() { throw Error("cuda::GemmContext", "cuBLASLt is not emulated: run this case on a GPU"); }
GemmContext::~GemmContext() = default;

void gemm_bf16(GemmContext&, bool, bool, int64_t, int64_t, int64_t, float, const bf16_t*, const bf16_t*, float,
               float*, Stream) {
  throw Error("cuda::gemm_bf16", "cuBLASLt is not emulated: run this case on a GPU");
}

}  // namespace ktune::cuda
