// What the emulated kernels link against in place of kernels/cuda/gemm.cu: GemmContext (its
// construction and run) and gemm_bf16 refuse with a ktune::Error ("cuBLASLt is not emulated"), so
// that code around GEMMs links — nf4.cu's NF4 linear, cross_entropy.cu, attention_gemm.cu and the
// decoder — and the test cases of nf4_test.cpp and decoder_test.cpp that reach no GEMM run.
// A case that reaches a GEMM fails loudly here; CMakeLists.txt leaves those cases out of CTest.
// It deliberately computes nothing: faking cuBLASLt would test the fake, not the kernels.
#include <memory>

#include "core/error.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

struct GemmContext::State {};

GemmContext::GemmContext() { throw Error("cuda::GemmContext", "cuBLASLt is not emulated: run this case on a GPU"); }
GemmContext::~GemmContext() = default;
void GemmContext::run(const GemmCall&, Stream) {
  throw Error("cuda::GemmContext::run", "cuBLASLt is not emulated: run this case on a GPU");
}

void gemm_bf16(GemmContext&, bool, bool, int64_t, int64_t, int64_t, float, const bf16_t*, const bf16_t*, float, float*,
               Stream) {
  throw Error("cuda::gemm_bf16", "cuBLASLt is not emulated: run this case on a GPU");
}

}  // namespace ktune::cuda
