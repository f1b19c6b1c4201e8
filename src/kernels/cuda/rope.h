// Rotary position embeddings on the GPU, HF half-split layout, with the CPU op's conventions
// (kernels/cpu/rope.h): x (N, H, D) rotated in place by the angle of positions[n].
// The cos/sin tables are the CPU RopeTable's (built once per model on the host, uploaded):
// cos, sin (max_positions, D/2) f32. x is f32 or bf16 (rotated in f32, rounded back).
// A position outside [0, max_positions) leaves its row unrotated and is recorded in `flag`.
// It deliberately does not build the table itself (one source of truth: RopeTable).
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

struct RopeTableView {
  const float* cos;  // (max_positions, D/2)
  const float* sin;
  int64_t max_positions, head_dim;
};

//  x[i] <- x[i]*cos - x[i+D/2]*sin ; x[i+D/2] <- x[i+D/2]*cos + x[i]*sin
void rope_forward(float* x, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                  int32_t* flag, Stream stream = nullptr);
void rope_forward(bf16_t* x, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                  int32_t* flag, Stream stream = nullptr);
// In place, the inverse rotation (the transpose): dx (N, H, D) from dy in the same buffer.
void rope_backward(float* dx, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                   int32_t* flag, Stream stream = nullptr);
void rope_backward(bf16_t* dx, const int32_t* positions, const RopeTableView& table, int64_t N, int64_t H, int64_t D,
                   int32_t* flag, Stream stream = nullptr);

}  // namespace ktune::cuda
