// Token embedding lookup and its scatter-add backward.
// out = table[ids] * scale (Gemma passes sqrt(C) rounded to the model dtype; others 1).
// It deliberately does not round or choose the scale: the model knows its dtype and family.
#pragma once

#include <cstdint>

namespace ktune::cpu {

// out (N, C) = table[ids] * scale.   ids (N)   table (V, C)
// Throws ktune::Error on a negative id; the overload with V also on ids >= V.
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, float scale);
void embedding_forward(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C, int64_t V,
                       float scale);
// Undoes out = table[ids] * scale:  dtable[ids[i]] += dout[i] * scale (accumulates).   dout (N, C)
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C, float scale);

void embedding_forward_reference(float* out, const int32_t* ids, const float* table, int64_t N, int64_t C,
                                 float scale);
void embedding_backward_reference(float* dtable, const float* dout, const int32_t* ids, int64_t N, int64_t C,
                                  float scale);

}  // namespace ktune::cpu
