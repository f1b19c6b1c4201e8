// Gated activations: a thread per element, f32 arithmetic (expf/tanhf, not the fast intrinsics).
#include "kernels/cuda/activation.h"

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"

namespace ktune::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCoeff = 0.044715f;

enum class Gate { kSwiGlu, kGeGluTanh };

template <Gate G, typename T>
__global__ void gated_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = load_f32(gate, i), u = load_f32(up, i);
  float a;
  if constexpr (G == Gate::kSwiGlu) {
    a = g / (1.0f + expf(-g));
  } else {
    a = 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + kGeluCoeff * g * g * g)));
  }
  store_f32(out, i, a * u);
}

template <Gate G, typename T>
__global__ void gated_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = load_f32(gate, i), u = load_f32(up, i), d = load_f32(dout, i);
  float a, da;
  if constexpr (G == Gate::kSwiGlu) {
    const float sig = 1.0f / (1.0f + expf(-g));
    a = g * sig;
    da = sig * (1.0f + g * (1.0f - sig));
  } else {
    const float t = tanhf(kSqrt2OverPi * (g + kGeluCoeff * g * g * g));
    a = 0.5f * g * (1.0f + t);
    da = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * kSqrt2OverPi * (1.0f + 3.0f * kGeluCoeff * g * g);
  }
  store_f32(dgate, i, d * u * da);
  store_f32(dup, i, d * a);
}

template <Gate G, typename T>
void forward(T* out, const T* gate, const T* up, int64_t n, Stream stream) {
  if (n == 0) return;
  gated_forward_kernel<G><<<blocks_for(n, 256), 256, 0, stream>>>(out, gate, up, n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

template <Gate G, typename T>
void backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int64_t n, Stream stream) {
  if (n == 0) return;
  gated_backward_kernel<G><<<blocks_for(n, 256), 256, 0, stream>>>(dgate, dup, dout, gate, up, n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n, Stream stream) {
  forward<Gate::kSwiGlu>(out, gate, up, n, stream);
}
void swiglu_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, Stream stream) {
  forward<Gate::kSwiGlu>(dev(out), dev(gate), dev(up), n, stream);
}
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                     Stream stream) {
  backward<Gate::kSwiGlu>(dgate, dup, dout, gate, up, n, stream);
}
void swiglu_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up, int64_t n,
                     Stream stream) {
  backward<Gate::kSwiGlu>(dev(dgate), dev(dup), dev(dout), dev(gate), dev(up), n, stream);
}
void geglu_tanh_forward(float* out, const float* gate, const float* up, int64_t n, Stream stream) {
  forward<Gate::kGeGluTanh>(out, gate, up, n, stream);
}
void geglu_tanh_forward(bf16_t* out, const bf16_t* gate, const bf16_t* up, int64_t n, Stream stream) {
  forward<Gate::kGeGluTanh>(dev(out), dev(gate), dev(up), n, stream);
}
void geglu_tanh_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up, int64_t n,
                         Stream stream) {
  backward<Gate::kGeGluTanh>(dgate, dup, dout, gate, up, n, stream);
}
void geglu_tanh_backward(bf16_t* dgate, bf16_t* dup, const bf16_t* dout, const bf16_t* gate, const bf16_t* up,
                         int64_t n, Stream stream) {
  backward<Gate::kGeGluTanh>(dev(dgate), dev(dup), dev(dout), dev(gate), dev(up), n, stream);
}

}  // namespace ktune::cuda
