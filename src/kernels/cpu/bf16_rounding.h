// Moving f32 values into bf16 storage, rounded to nearest even: the bf16 operands of a GEMM made
// from f32 activations (round_to_bf16), and an f32 partial sum added into a bf16 gradient with one
// rounding (add_rounded_to_bf16). Stochastic rounding is the optimizer's (adamw.h), not this file's.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace ktune::cpu {

// Floats of f32 scratch that hold n bf16 values (rounded up to whole floats, so that what a caller
// carves after them stays 4-byte aligned).
inline int64_t bf16_floats(int64_t n) { return (n + 1) / 2; }
// The bf16 view of f32 scratch (the scratch arenas are carved in floats).
inline bf16_t* as_bf16(float* scratch) { return reinterpret_cast<bf16_t*>(scratch); }

// dst (n) = bf16(src (n)). Parallel over the threads in force.
void round_to_bf16(bf16_t* dst, const float* src, int64_t n);
// dst (n) = bf16(f32(dst) + src): the sum in f32, rounded once. Parallel over the threads in force.
void add_rounded_to_bf16(bf16_t* dst, const float* src, int64_t n);

}  // namespace ktune::cpu
