// What the emulated kernels link against in place of kernels/cuda/gemm.cu: a GemmContext that runs
// each GemmCall on the host, as gemm.h specifies it — row-major C (M, N) = alpha op(A) op(B) + beta C,
// leading dimensions (checked_leading_dims, the real rules), bf16 or f32 inputs, f32 accumulation in
// order, an f32 C or one rounded to bf16 (nearest even), the bias (in C's dtype) added to every row,
// strided batches; beta == 0 never reads C. Device memory is host memory here, so it reads the
// operands directly. gemm_calls.cu (the signature wrappers) is compiled from the real source on top.
// With it the code around the GEMMs — the GPU decoder step, the fused loss, the GEMM attention path,
// the NF4 linear — runs under the emulator against the CPU references.
// It deliberately tests nothing of cuBLASLt: how gemm.cu maps a call onto cuBLASLt's column-major
// layouts is gemm_test.cpp's on a GPU, and that file is not run here (it would test these loops).
#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

namespace {

float load(const void* p, DType t, int64_t i) {
  return t == DType::F32 ? static_cast<const float*>(p)[i] : bf16_to_f32(static_cast<const bf16_t*>(p)[i]);
}

void store(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<bf16_t*>(p)[i] = f32_to_bf16(v);
}

}  // namespace

// The distinct call shapes seen, as cached_plans() counts them on the GPU, and the products run.
struct GemmContext::State {
  std::set<std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, int64_t>> shapes;
  int64_t calls = 0;
};

GemmContext::GemmContext() : state_(std::make_unique<State>()) {}
GemmContext::~GemmContext() = default;

int64_t GemmContext::cached_plans() const { return int64_t(state_->shapes.size()); }
int64_t GemmContext::calls() const { return state_->calls; }

void GemmContext::run(const GemmCall& g, Stream) {
  const GemmLeadingDims ld = checked_leading_dims(g);
  if (g.M > 0 && g.N > 0) ++state_->calls;  // as gemm.cu counts: empty products launch nothing
  state_->shapes.insert({g.trans_a, g.trans_b, g.M, g.N, g.K, ld.lda, ld.ldb, ld.ldc, int(g.in), int(g.out),
                         g.bias != nullptr, g.batch});
  const size_t in_bytes = g.in == DType::F32 ? 4 : 2, out_bytes = g.out == DType::F32 ? 4 : 2;
  for (int64_t b = 0; b < g.batch; ++b) {
    const char* A = static_cast<const char*>(g.A) + size_t(b * g.stride_a) * in_bytes;
    const char* B = static_cast<const char*>(g.B) + size_t(b * g.stride_b) * in_bytes;
    char* C = static_cast<char*>(g.C) + size_t(b * g.stride_c) * out_bytes;
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = 0; n < g.N; ++n) {
        float acc = 0.0f;  // (M, K) @ (K, N), A(m, k) at trans_a ? k*lda + m : m*lda + k
        for (int64_t k = 0; k < g.K; ++k)
          acc += load(A, g.in, g.trans_a ? k * ld.lda + m : m * ld.lda + k) *
                 load(B, g.in, g.trans_b ? n * ld.ldb + k : k * ld.ldb + n);
        float c = g.alpha * acc;
        if (g.beta != 0.0f) c += g.beta * load(C, g.out, m * ld.ldc + n);
        if (g.bias) c += load(g.bias, g.out, n);
        store(C, g.out, m * ld.ldc + n, c);
      }
  }
}

}  // namespace ktune::cuda
