// Fused linear + cross-entropy, chunk by chunk (see cross_entropy.h). The row kernel makes three
// passes over a row of V logits (max, sum of exp, gradient), recomputing the soft-cap each time
// instead of storing it: the row stays in L2 and the passes are bandwidth-cheap next to the GEMMs.
#include "kernels/cuda/cross_entropy.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_memory.h"

namespace ktune::cuda {
namespace {

constexpr int kRowThreads = 512;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

__device__ __forceinline__ float capped(float x, float cap) { return cap > 0.0f ? cap * tanhf(x / cap) : x; }

// One block per row of the chunk. logits (rows, V) f32 -> dlogits (rows, V) bf16, loss (rows),
// valid (rows) 1/0; a bad label records its global row (row0 + r) in flag.
__global__ void cross_entropy_rows_kernel(__nv_bfloat16* dlogits, float* loss, int32_t* valid, const float* logits,
                                          const int32_t* labels, int64_t V, float softcap, float grad_scale,
                                          int64_t row0, int32_t* flag) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const float* z = logits + r * V;
  __nv_bfloat16* dz = dlogits + r * V;
  const int32_t label = labels[r];
  const bool ok = label >= 0 && label < V;
  if (!ok) {
    for (int64_t c = threadIdx.x; c < V; c += blockDim.x) dz[c] = __float2bfloat16_rn(0.0f);
    if (threadIdx.x == 0) {
      loss[r] = 0.0f;
      valid[r] = 0;
      if (label != -100) flag_bad_row(flag, row0 + r);
    }
    return;
  }
  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, capped(z[c], softcap));
  m = block_max(m, shared);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(capped(z[c], softcap) - m);
  s = block_sum(s, shared);
  const float lse = m + logf(s);
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float x = z[c];
    float zc = capped(x, softcap);
    float g = expf(zc - lse) - (c == label ? 1.0f : 0.0f);
    if (softcap > 0.0f) {
      float t = zc / softcap;
      g *= 1.0f - t * t;
    }
    dz[c] = __float2bfloat16_rn(g * grad_scale);
  }
  if (threadIdx.x == 0) {
    loss[r] = lse - capped(z[label], softcap);
    valid[r] = 1;
  }
}

}  // namespace

size_t linear_cross_entropy_scratch_bytes(int64_t chunk_tokens, int64_t V) {
  const size_t cv = size_t(chunk_tokens) * size_t(V);
  return align256(cv * sizeof(float)) + align256(cv * sizeof(uint16_t)) + align256(size_t(chunk_tokens) * 4) +
         align256(size_t(chunk_tokens) * 4) + 256;
}

double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, void* scratch, Stream stream) {
  check(N >= 0 && C > 0 && V > 0 && chunk_tokens > 0, "cuda cross_entropy", "sizes must be positive");
  const size_t cv = size_t(chunk_tokens) * size_t(V);
  char* base = static_cast<char*>(scratch);
  float* logits = reinterpret_cast<float*>(base);
  base += align256(cv * sizeof(float));
  auto* dlogits = reinterpret_cast<bf16_t*>(base);
  base += align256(cv * sizeof(uint16_t));
  float* loss = reinterpret_cast<float*>(base);
  base += align256(size_t(chunk_tokens) * 4);
  auto* valid = reinterpret_cast<int32_t*>(base);
  base += align256(size_t(chunk_tokens) * 4);
  auto* flag = reinterpret_cast<int32_t*>(base);
  const int32_t none = kNoBadIndex;
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(flag, &none, sizeof none, cudaMemcpyHostToDevice, stream));

  double total = 0;
  int64_t count = 0;
  std::vector<float> loss_host(size_t(std::min(chunk_tokens, std::max<int64_t>(N, 1))));
  std::vector<int32_t> valid_host(loss_host.size());
  for (int64_t r0 = 0; r0 < N; r0 += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, N - r0);
    const bf16_t* h = hidden + r0 * C;
    // logits (rows, V) = h (rows, C) @ W^T
    gemm_bf16(ctx, false, true, rows, V, C, 1.0f, h, weight, 0.0f, logits, stream);
    cross_entropy_rows_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(dlogits), loss, valid, logits, labels + r0, V, softcap, grad_scale, r0, flag);
    KTUNE_CUDA_CHECK_LAUNCH();
    // dhidden (rows, C) = dlogits (rows, V) @ W (V, C);  dW (V, C) += dlogits^T @ h
    if (dhidden) {
      GemmCall g;
      g.M = rows, g.N = C, g.K = V, g.A = dlogits, g.B = weight, g.C = dhidden + r0 * C;
      ctx.run(g, stream);
    }
    if (dweight) {
      GemmCall g;
      g.trans_a = true, g.M = V, g.N = C, g.K = rows, g.beta = 1.0f, g.A = dlogits, g.B = h, g.C = dweight;
      ctx.run(g, stream);
    }
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(loss_host.data(), loss, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream));
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(valid_host.data(), valid, size_t(rows) * 4, cudaMemcpyDeviceToHost, stream));
    KTUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int64_t r = 0; r < rows; ++r) {
      total += double(loss_host[size_t(r)]);
      count += valid_host[size_t(r)];
    }
  }
  int32_t bad = kNoBadIndex;
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(&bad, flag, sizeof bad, cudaMemcpyDeviceToHost, stream));
  KTUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad != kNoBadIndex)
    throw Error("cuda cross_entropy: token " + std::to_string(bad), "label outside [0, " + std::to_string(V) + ") and not -100");
  if (n_valid) *n_valid = count;
  return total;
}

}  // namespace ktune::cuda
