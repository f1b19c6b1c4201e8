// f32 -> bf16 rounding loops (see bf16_rounding.h); `omp simd` so they vectorise.
#include "kernels/cpu/bf16_rounding.h"

#include "core/parallel.h"

namespace ktune::cpu {

void round_to_bf16(bf16_t* dst, const float* src, int64_t n) {
  parallel_for(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dst[i] = f32_to_bf16(src[i]);
  }, 1 << 15);
}

void add_rounded_to_bf16(bf16_t* dst, const float* src, int64_t n) {
  parallel_for(n, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) dst[i] = f32_to_bf16(bf16_to_f32(dst[i]) + src[i]);
  }, 1 << 15);
}

}  // namespace ktune::cpu
