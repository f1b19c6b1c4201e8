// Token embedding lookup and its scatter-add backward on the GPU (kernels/cpu/embedding.h's
// conventions): out = table[ids] * scale; dtable[ids[i]] += dout[i] * scale.
// The table and out are f32 or bf16 (same type); dtable is always f32 (gradients accumulate in f32).
// Bad ids (< 0 or >= V) are not read: their output rows are left zero and the first bad row is
// recorded in `flag` (IndexFlag, device_memory.h; may be nullptr), which the caller checks.
// It deliberately accumulates the backward with f32 atomics: the order in which tokens sharing an
// id are summed is not fixed, so dtable may differ run to run in the last bits.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// out (N, C) = table[ids] * scale.   ids (N)   table (V, C)
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V, float scale,
                       int32_t* flag, Stream stream = nullptr);
void embedding_forward(bf16_t* out, const int32_t* ids, const bf16_t* table, int64_t N, int64_t C, int64_t V,
                       float scale, int32_t* flag, Stream stream = nullptr);
// Undoes out = table[ids] * scale:  dtable (V, C) f32 += dout (N, C) * scale at the rows ids name.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        float scale, int32_t* flag, Stream stream = nullptr);
void embedding_backward(float* dtable, const bf16_t* dout, const int32_t* ids, int64_t N, int64_t C, int64_t V,
                        float scale, int32_t* flag, Stream stream = nullptr);

}  // namespace ktune::cuda
