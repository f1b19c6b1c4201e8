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
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) m = fmaxf(m, softcap_score(z[c], softcap));
  m = block_max(m, shared);
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) s += expf(softcap_score(z[c], softcap) - m);
  s = block_sum(s, shared);
  const float lse = m + logf(s);
  for (int64_t c = threadIdx.x; c < V; c += blockDim.x) {
    float x = z[c];
    float zc = softcap_score(x, softcap);
    float g = expf(zc - lse) - (c == label ? 1.0f : 0.0f);
    if (softcap > 0.0f) {
      float t = zc / softcap;
      g *= 1.0f - t * t;
    }
    dz[c] = __float2bfloat16_rn(g * grad_scale);
  }
  if (threadIdx.x == 0) {
    loss[r] = lse - softcap_score(z[label], softcap);
    valid[r] = 1;
  }
}

// Adds the chunk's losses and valid count to the running totals, in double and in a fixed order
// (one block; thread t takes rows t, t+256, ...; then a tree): the same sum on every run.
constexpr int kSumThreads = 256;
__global__ void accumulate_chunk_kernel(double* total, long long* count, const float* loss, const int32_t* valid,
                                        int64_t rows) {
  __shared__ double sums[kSumThreads];
  __shared__ long long counts[kSumThreads];
  double s = 0;
  long long c = 0;
  for (int64_t r = threadIdx.x; r < rows; r += kSumThreads) {
    s += double(loss[r]);
    c += valid[r];
  }
  sums[threadIdx.x] = s;
  counts[threadIdx.x] = c;
  __syncthreads();
  for (int stride = kSumThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      sums[threadIdx.x] += sums[threadIdx.x + stride];
      counts[threadIdx.x] += counts[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    *total += sums[0];
    *count += counts[0];
  }
}

// The totals and the bad-label flag, at the end of the scratch.
struct Totals {
  double loss;
  long long count;
  int32_t bad_row;
};

}  // namespace

size_t linear_cross_entropy_scratch_bytes(int64_t chunk_tokens, int64_t V) {
  const size_t cv = size_t(chunk_tokens) * size_t(V);
  return align256(cv * sizeof(float)) + align256(cv * sizeof(uint16_t)) + align256(size_t(chunk_tokens) * 4) +
         align256(size_t(chunk_tokens) * 4) + align256(sizeof(Totals));
}

double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, void* scratch, Stream stream) {
  return linear_cross_entropy(ctx, dhidden, dweight, n_valid, hidden, weight, LoraHead{}, labels, N, C, V, softcap,
                              grad_scale, chunk_tokens, scratch, stream);
}

double linear_cross_entropy(GemmContext& ctx, float* dhidden, float* dweight, int64_t* n_valid, const bf16_t* hidden,
                            const bf16_t* weight, const LoraHead& lora, const int32_t* labels, int64_t N, int64_t C,
                            int64_t V, float softcap, float grad_scale, int64_t chunk_tokens, void* scratch,
                            Stream stream) {
  check(N >= 0 && C > 0 && V > 0 && chunk_tokens > 0, "cuda cross_entropy", "sizes must be positive");
  check(lora.rank == 0 || (lora.rank > 0 && lora.b && lora.xa), "cuda cross_entropy",
        "LoRA on the head needs rank > 0, B and xa");
  const int64_t r = lora.rank;
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
  auto* totals = reinterpret_cast<Totals*>(base);
  const Totals zero{0.0, 0, kNoBadIndex};
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(totals, &zero, sizeof zero, cudaMemcpyHostToDevice, stream));

  for (int64_t r0 = 0; r0 < N; r0 += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, N - r0);
    const bf16_t* h = hidden + r0 * C;
    // logits (rows, V) = h (rows, C) @ W^T
    gemm_bf16(ctx, false, true, rows, V, C, 1.0f, h, weight, 0.0f, logits, stream);
    // LoRA: logits (rows, V) += s · xa (rows, r) @ B^T
    if (r > 0) gemm_bf16(ctx, false, true, rows, V, r, lora.scale, lora.xa + r0 * r, lora.b, 1.0f, logits, stream);
    cross_entropy_rows_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(reinterpret_cast<__nv_bfloat16*>(dlogits),
                                                                           loss, valid, logits, labels + r0, V, softcap,
                                                                           grad_scale, r0, &totals->bad_row);
    KTUNE_CUDA_CHECK_LAUNCH();
    accumulate_chunk_kernel<<<1, kSumThreads, 0, stream>>>(&totals->loss, &totals->count, loss, valid, rows);
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
    // LoRA: dxa (rows, r) = s · dlogits (rows, V) @ B (V, r);  dB (V, r) += s · dlogits^T @ xa (rows, r)
    if (r > 0 && lora.dxa) {
      GemmCall g;
      g.M = rows, g.N = r, g.K = V, g.alpha = lora.scale, g.A = dlogits, g.B = lora.b, g.C = lora.dxa + r0 * r;
      g.out = DType::BF16;
      ctx.run(g, stream);
    }
    if (r > 0 && lora.db) {
      GemmCall g;
      g.trans_a = true, g.M = V, g.N = r, g.K = rows, g.alpha = lora.scale, g.beta = 1.0f, g.A = dlogits,
      g.B = lora.xa + r0 * r, g.C = lora.db;
      ctx.run(g, stream);
    }
  }
  Totals result{};
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(&result, totals, sizeof result, cudaMemcpyDeviceToHost, stream));
  KTUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (result.bad_row != kNoBadIndex)
    throw Error("cuda cross_entropy: token " + std::to_string(result.bad_row),
                "label outside [0, " + std::to_string(V) + ") and not -100");
  const double total = result.loss;
  const int64_t count = result.count;
  if (n_valid) *n_valid = count;
  return total;
}

}  // namespace ktune::cuda
