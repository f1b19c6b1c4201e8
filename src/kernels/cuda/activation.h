// The gated MLP activations on the GPU with the CPU op's conventions (kernels/cpu/activation.h):
// SwiGLU (Llama/Qwen/Mistral) and GELU-tanh gating (Gemma), elementwise over n values, f32 or bf16
// (one type for all buffers), computed in f32. It deliberately has no exact-erf GELU.
#pragma once

#include <cstdint>

#include "core/dtype.h"
#include "kernels/cuda/gemm.h"

namespace ktune::cuda {

// out = silu(gate) * up
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream stream = nullptr);
void swiglu_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, Stream stream = nullptr);
// Undoes out = silu(gate) * up: dgate, dup overwritten. In place is allowed (dgate == gate,
// dup == up): each element is read before it is written, by the one thread that writes it.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                     Stream stream = nullptr);
void swiglu_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up, int64_t n,
                     Stream stream = nullptr);
// out = gelu_tanh(gate) * up,  gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))
void geglu_tanh_forward(float* out, const float* gate, const float* up, int64_t n, Stream stream = nullptr);
void geglu_tanh_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, Stream stream = nullptr);
// Undoes out = gelu_tanh(gate) * up; in place allowed, as swiglu_backward.
void geglu_tanh_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                         Stream stream = nullptr);
void geglu_tanh_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up,
                         int64_t n, Stream stream = nullptr);

}  // namespace ktune::cuda
