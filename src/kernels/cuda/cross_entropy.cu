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
#include "kernels/cuda/nf4.h"

namespace ktune::cuda {
namespace {

constexpr int kRowThreads = 512;

size_t align256(size_t b) { return (b + 255) / 256 * 256; }

// One block per row of the chunk. logits (rows, V) f32 -> dlogits (rows, V) bf16, loss (rows),
// valid (rows) 1/0; a bad label records its global row (row0 + r) in flag.
// DoRA on the head: the row's logit at column c is col_scale[c] * z[c] + addend[c] (either nullptr: 1, 0).
struct RowLogits {
  const float* z;
  const float* col_scale;
  const float* addend;
  __device__ __forceinline__ float operator[](int64_t c) const {
    float x = col_scale ? col_scale[c] * z[c] : z[c];
    return addend ? x + addend[c] : x;
  }
};

__global__ void cross_entropy_rows_kernel(__nv_bfloat16* dlogits, float* loss, int32_t* valid, const float* logits,
                                          const float* col_scale, const float* addend, const int32_t* labels,
                                          int64_t V, float softcap, float grad_scale, int64_t row0, int32_t* flag) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const RowLogits z{logits + r * V, col_scale, addend ? addend + r * V : nullptr};
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

// DoRA on the head, one thread per vocabulary column v over the chunk's rows (a fixed order):
// dm[v] += Σ_rows dz[n, v] pre[n, v] / norm[v].
__global__ void dora_head_magnitude_grad_kernel(float* dm, const __nv_bfloat16* dz, const float* pre,
                                                const float* norm, int64_t rows, int64_t V) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= V) return;
  float sum = 0.0f;
  for (int64_t n = 0; n < rows; ++n) sum += __bfloat162float(dz[n * V + v]) * pre[n * V + v];
  dm[v] += sum / norm[v];
}

// out (rows, V) = dz ⊙ (c[v] + offset), rounded to bf16 (out may be dz).
__global__ void dora_head_scale_kernel(__nv_bfloat16* out, const __nv_bfloat16* dz, const float* c, float offset,
                                       int64_t rows, int64_t V) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * V) return;
  out[i] = __float2bfloat16_rn(__bfloat162float(dz[i]) * (c[i % V] + offset));
}

// y (n) -= x (n), f32: DoRA with dropout's h Wᵀ − h' Wᵀ.
__global__ void subtract_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] -= x[i];
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

// The totals and the bad-label flag: in a buffer of the caller's (linear_cross_entropy_enqueue), or
// at the start of the scratch (linear_cross_entropy).
struct Totals {
  double loss;
  long long count;
  int32_t bad_row;
};

}  // namespace

size_t linear_cross_entropy_scratch_bytes(int64_t chunk_tokens, int64_t V, bool dropped_hidden) {
  const size_t cv = size_t(chunk_tokens) * size_t(V);
  return align256(cv * sizeof(float)) + align256(cv * sizeof(uint16_t)) + align256(size_t(chunk_tokens) * 4) +
         align256(size_t(chunk_tokens) * 4) + align256(sizeof(Totals)) +
         (dropped_hidden ? align256(cv * sizeof(float)) : 0);
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
  // the totals in the scratch's first bytes, the pass's scratch after them
  void* totals_at = scratch;
  void* pass_scratch = static_cast<char*>(scratch) + align256(sizeof(Totals));
  linear_cross_entropy_enqueue(ctx, dhidden, dweight, hidden, weight, lora, labels, N, C, V, softcap, grad_scale,
                               chunk_tokens, pass_scratch, totals_at, stream);
  const CrossEntropyTotals totals = linear_cross_entropy_totals(totals_at, V, stream);
  if (n_valid) *n_valid = totals.n_valid;
  return totals.loss_sum;
}

void linear_cross_entropy_enqueue(GemmContext& ctx, float* dhidden, float* dweight, const bf16_t* hidden,
                                  const bf16_t* weight, const LoraHead& lora, const int32_t* labels, int64_t N,
                                  int64_t C, int64_t V, float softcap, float grad_scale, int64_t chunk_tokens,
                                  void* scratch, void* totals_at, Stream stream) {
  check(N >= 0 && C > 0 && V > 0 && chunk_tokens > 0, "cuda cross_entropy", "sizes must be positive");
  check(lora.rank == 0 || (lora.rank > 0 && lora.b && lora.xa), "cuda cross_entropy",
        "LoRA on the head needs rank > 0, B and xa");
  const bool nf4 = weight == nullptr;
  check(!nf4 || (lora.nf4_codes && lora.nf4_scales && lora.nf4_block && lora.nf4_block_rows > 0 &&
                 lora.nf4_block_rows * C % 64 == 0 && !dweight),
        "cuda cross_entropy",
        "an NF4 head needs its codes, scales and a block of rows (rows * C a multiple of 64), and is frozen");
  const bool dora = lora.dora_scale != nullptr;
  check(!dora || (lora.rank > 0 && lora.weight_norm && !dweight), "cuda cross_entropy",
        "DoRA on the head needs the low-rank term, its norms and a frozen W");
  check(!lora.dropped_hidden || dora, "cuda cross_entropy", "dropped hidden rows are DoRA's (dropout) only");
  const int64_t r = lora.rank;
  const size_t cv = size_t(chunk_tokens) * size_t(V);
  char* base = static_cast<char*>(scratch);
  auto* totals = static_cast<Totals*>(totals_at);
  float* logits = reinterpret_cast<float*>(base);  // (rows, V); DoRA: the unscaled h' Wᵀ + s xa Bᵀ
  base += align256(cv * sizeof(float));
  auto* dlogits = reinterpret_cast<bf16_t*>(base);
  base += align256(cv * sizeof(uint16_t));
  float* loss = reinterpret_cast<float*>(base);
  base += align256(size_t(chunk_tokens) * 4);
  auto* valid = reinterpret_cast<int32_t*>(base);
  base += align256(size_t(chunk_tokens) * 4);
  // DoRA with dropout: (rows, V) f32 h Wᵀ − h' Wᵀ, then (rows, V) bf16 dz ⊙ (c − 1)
  float* aux = lora.dropped_hidden ? reinterpret_cast<float*>(base) : nullptr;
  const Totals zero{0.0, 0, kNoBadIndex};
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(totals, &zero, sizeof zero, cudaMemcpyHostToDevice, stream));

  // W's rows [v0, v0 + rows) as bf16 for fn(w_rows, v0, rows): W itself in one block, or (NF4) each
  // block of nf4_block_rows rows dequantised into nf4_block (a block starts at element v0 C, a
  // multiple of 64: its codes at byte v0 C / 2, its scales at v0 C / 64).
  auto for_each_weight_block = [&](auto&& fn) {
    if (!nf4) return fn(weight, int64_t(0), V);
    for (int64_t v0 = 0; v0 < V; v0 += lora.nf4_block_rows) {
      const int64_t rows = std::min(lora.nf4_block_rows, V - v0);
      nf4_dequantize(lora.nf4_block, lora.nf4_codes + v0 * C / 2, lora.nf4_scales + v0 * C / 64, rows * C, stream);
      fn(static_cast<const bf16_t*>(lora.nf4_block), v0, rows);
    }
  };
  // out (rows, C) (+)= g[:, v0 : v0 + vrows] (rows, V) @ W[v0 : v0 + vrows] (vrows, C): beta 1 after the first block
  auto input_gradient = [&](void* out, DType out_type, const bf16_t* g, const bf16_t* w, int64_t v0, int64_t vrows,
                            int64_t rows) {
    GemmCall call;
    call.M = rows, call.N = C, call.K = vrows, call.A = g + v0, call.lda = V, call.B = w, call.C = out;
    call.beta = v0 > 0 ? 1.0f : 0.0f, call.out = out_type;
    ctx.run(call, stream);
  };

  for (int64_t r0 = 0; r0 < N; r0 += chunk_tokens) {
    const int64_t rows = std::min(chunk_tokens, N - r0);
    const bf16_t* h = hidden + r0 * C;
    const bf16_t* hd = lora.dropped_hidden ? lora.dropped_hidden + r0 * C : nullptr;
    // logits (rows, V) = h (rows, C) @ W^T (DoRA with dropout: h' W^T, and aux = h W^T), a block of
    // W's rows (logits' columns) at a time
    for_each_weight_block([&](const bf16_t* w, int64_t v0, int64_t vrows) {
      gemm_bf16_strided(ctx, false, true, rows, vrows, C, 1.0f, hd ? hd : h, C, w, C, 0.0f, logits + v0, V, stream);
      if (aux) gemm_bf16_strided(ctx, false, true, rows, vrows, C, 1.0f, h, C, w, C, 0.0f, aux + v0, V, stream);
    });
    if (aux) {  // aux = h W^T − h' W^T
      subtract_kernel<<<blocks_for(rows * V, 256), 256, 0, stream>>>(aux, logits, rows * V);
      KTUNE_CUDA_CHECK_LAUNCH();
    }
    // LoRA: logits (rows, V) += s · xa (rows, r) @ B^T
    if (r > 0) gemm_bf16(ctx, false, true, rows, V, r, lora.scale, lora.xa + r0 * r, lora.b, 1.0f, logits, stream);
    cross_entropy_rows_kernel<<<unsigned(rows), kRowThreads, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16*>(dlogits), loss, valid, logits, lora.dora_scale, aux, labels + r0, V, softcap,
        grad_scale, r0, &totals->bad_row);
    KTUNE_CUDA_CHECK_LAUNCH();
    accumulate_chunk_kernel<<<1, kSumThreads, 0, stream>>>(&totals->loss, &totals->count, loss, valid, rows);
    KTUNE_CUDA_CHECK_LAUNCH();
    auto* dz = reinterpret_cast<__nv_bfloat16*>(dlogits);
    if (dora) {
      // logits = [aux +] c ⊙ pre:  dm += Σ_rows dz ⊙ pre / norm (the norm detached)
      if (lora.dmagnitude) {
        dora_head_magnitude_grad_kernel<<<blocks_for(V, 256), 256, 0, stream>>>(lora.dmagnitude, dz, logits,
                                                                                 lora.weight_norm, rows, V);
        KTUNE_CUDA_CHECK_LAUNCH();
      }
      // dropout: dhidden = dz W (through h), ddropped = ((c − 1) ⊙ dz) W (through h' in the base terms)
      if (aux && (dhidden || lora.ddropped_hidden)) {
        auto* dzc1 = reinterpret_cast<__nv_bfloat16*>(aux);  // (rows, V) bf16 in aux's bytes, read no more
        dora_head_scale_kernel<<<blocks_for(rows * V, 256), 256, 0, stream>>>(dzc1, dz, lora.dora_scale, -1.0f,
                                                                               rows, V);
        KTUNE_CUDA_CHECK_LAUNCH();
        for_each_weight_block([&](const bf16_t* w, int64_t v0, int64_t vrows) {
          if (dhidden) input_gradient(dhidden + r0 * C, DType::F32, dlogits, w, v0, vrows, rows);
          if (lora.ddropped_hidden)
            input_gradient(lora.ddropped_hidden + r0 * C, DType::F32, reinterpret_cast<bf16_t*>(dzc1), w, v0, vrows,
                           rows);
        });
      }
      // dpre = dz ⊙ c, in place: the gradient at pre, which the LoRA term (and without dropout dhidden) reads
      dora_head_scale_kernel<<<blocks_for(rows * V, 256), 256, 0, stream>>>(dz, dz, lora.dora_scale, 0.0f, rows, V);
      KTUNE_CUDA_CHECK_LAUNCH();
    }
    // dhidden (rows, C) = dlogits (rows, V) @ W (V, C) (DoRA with dropout: done above);  dW (V, C) += dlogits^T @ h
    if (dhidden && !aux)
      for_each_weight_block([&](const bf16_t* w, int64_t v0, int64_t vrows) {
        input_gradient(dhidden + r0 * C, DType::F32, dlogits, w, v0, vrows, rows);
      });
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
}

size_t linear_cross_entropy_totals_bytes() { return sizeof(Totals); }

CrossEntropyTotals linear_cross_entropy_totals(const void* totals_at, int64_t V, Stream stream) {
  Totals result{};
  KTUNE_CUDA_CHECK(cudaMemcpyAsync(&result, totals_at, sizeof result, cudaMemcpyDeviceToHost, stream));
  KTUNE_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (result.bad_row != kNoBadIndex)
    throw Error("cuda cross_entropy: token " + std::to_string(result.bad_row),
                "label outside [0, " + std::to_string(V) + ") and not -100");
  return CrossEntropyTotals{result.loss, int64_t(result.count)};
}

}  // namespace ktune::cuda
