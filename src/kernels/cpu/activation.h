// Elementwise ops of the decoder: the gated MLP activations (SwiGLU for Llama/Qwen/Mistral,
// GELU-tanh gating for Gemma), residual adds, and soft-capping. All are over n contiguous floats.
// It deliberately does not hold the MLP's GEMMs (linear.h) nor exact-erf GELU (no family here uses it).
#pragma once

#include <cstdint>

namespace ktune::cpu {

// out = silu(gate) * up,  silu(g) = g * sigmoid(g)
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// Undoes out = silu(gate) * up: dgate, dup overwritten.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n);
// out = gelu_tanh(gate) * up,  gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))  (gelu_pytorch_tanh)
void geglu_tanh_forward(float* out, const float* gate, const float* up, int64_t n);
void geglu_tanh_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                         int64_t n);
void add_inplace(float* y, const float* x, int64_t n);  // residual: y += x
void softcap_forward(float* x, int64_t n, float cap);   // in place: x = cap * tanh(x / cap)
// Undoes y = cap * tanh(x / cap) in place: dx = dy * (1 - (y / cap)^2), given y (the capped values).
void softcap_backward(float* dx, const float* y, int64_t n, float cap);

void swiglu_forward_reference(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward_reference(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                               int64_t n);
void geglu_tanh_forward_reference(float* out, const float* gate, const float* up, int64_t n);
void geglu_tanh_backward_reference(float* dgate, float* dup, const float* dout, const float* gate,
                                   const float* up, int64_t n);

}  // namespace ktune::cpu
