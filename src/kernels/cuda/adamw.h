// AdamW on the GPU, fused into one pass over the parameters, with the CPU op's semantics
// (kernels/cpu/adamw.h: torch.optim.AdamW, decoupled weight decay, eps outside the square root,
// 1-based step). The bf16 variant keeps param, m, v in bf16 and rounds stochastically with the very
// same counter-based random bits as the CPU (splitmix64 of seed and element index), so the GPU and
// the CPU agree bit for bit wherever their f32 arithmetic does (they may differ in FMA contraction).
// Also the two reductions gradient clipping needs. It deliberately holds no optimizer state itself.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cpu/adamw.h"  // AdamWStep (a plain struct; nothing of the CPU code is linked)
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

using cpu::AdamWStep;
using cpu::AdamWCoefficients;
using cpu::adamw_coefficients;

// param, grad, m, v: (n) on the device
void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, const AdamWStep& s,
                Stream stream = nullptr);
// first: the index of param[0] within its tensor, for the random bits (a shard of a tensor rounds as
// the whole tensor's step does there).
void adamw_step_bf16(bf16_t* param, const float* grad, bf16_t* m, bf16_t* v, int64_t n, const AdamWStep& s,
                     uint64_t seed, Stream stream = nullptr, int64_t first = 0);

// Gradient clipping's two reductions. sum_of_squares writes sum(x^2) (double accumulation, fixed
// order: the same value on every run) to scratch[0]; scratch holds sum_of_squares_scratch_doubles()
// doubles of device memory. scale_inplace: x *= factor.
int64_t sum_of_squares_scratch_doubles();
void sum_of_squares(double* scratch, const float* x, int64_t n, Stream stream = nullptr);
void scale_inplace(float* x, int64_t n, float factor, Stream stream = nullptr);
// y += x, (n) f32 each: a sharded gradient's reduced piece added into its accumulator (ZeRO-2).
void accumulate_inplace(float* y, const float* x, int64_t n, Stream stream = nullptr);

}  // namespace ktune::cuda
