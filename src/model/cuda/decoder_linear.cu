// cuda::Decoder's projections: y = x W^T + b with W bf16 or NF4 (dequantised into the scratch, or
// inside the fused NF4 GEMM), LoRA's low-rank term (with dropout), DoRA, and their backward, as
// LoraAdapter::forward and ::backward compute them.
#include "model/cuda/decoder_impl.h"

namespace ktune::cuda {

using namespace decoder_internal;

LinearRef Decoder::Impl::lin(const Linear& l) {
  LinearRef ref{P(l.weight).value, P(l.weight).grad};
  ref.in = l.in, ref.out = l.out, ref.r = lora_rank, ref.scale = lora_scale;
  ref.nf4_codes = P(l.weight).nf4_codes, ref.nf4_scales = P(l.weight).nf4_scales;
  if (dropping && l.lora_a >= 0) {
    ref.dropout = dropout_p;
    ref.dropout_seed = lora_dropout_seed(lora_seed, dropout_key, l.module);
  }
  if (l.bias >= 0) ref.bias = P(l.bias).value, ref.dbias = P(l.bias).grad;
  if (l.lora_a >= 0) {
    ref.a = P(l.lora_a).value, ref.da = P(l.lora_a).grad;
    ref.b = P(l.lora_b).value, ref.db = P(l.lora_b).grad;
  }
  if (l.magnitude >= 0) {
    ref.m = P(l.magnitude).value, ref.dm = P(l.magnitude).grad;
    ref.pre = l.dora_pre, ref.norm = l.dora_norm, ref.c = l.dora_scale;
  }
  return ref;
}

// W (out, in) bf16 for a GEMM: the weight itself, or (QLoRA) its NF4 codes dequantised into the
// scratch, which holds it until the next NF4 projection's call.
const bf16_t* Decoder::Impl::base_weight(const LinearRef& w) {
  if (!w.nf4_codes) return w.w;
  nf4_dequantize(nf4_weight, w.nf4_codes, w.nf4_scales, w.out * w.in);
  return nf4_weight;
}

// With TrainingSetup::nf4_fused_gemm, an NF4 base of shapes the fused kernel takes (DoRA's read the
// whole W for their norms and keep the scratch).
bool Decoder::Impl::fused_nf4(const LinearRef& w) const {
  return w.nf4_codes && nf4_gemm_fused(nf4_fused, w.m != nullptr, w.out, w.in);
}

// y (N, out) = beta * y + x W^T [+ b]: cuBLASLt on W (bf16, or NF4 dequantised into the scratch), or
// the GEMM that dequantises NF4 tile by tile.
void Decoder::Impl::base_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, float beta) {
  if (!fused_nf4(w)) return mm(false, true, N, w.out, w.in, 1.0f, x, base_weight(w), beta, y, DType::BF16, w.bias);
  Nf4GemmCall g;
  g.M = N, g.N = w.out, g.K = w.in, g.beta = beta, g.A = x, g.codes = w.nf4_codes, g.scales = w.nf4_scales;
  g.w_transposed = true, g.C = y, g.out = DType::BF16, g.bias = w.bias;
  nf4_gemm(g);
}

// dx (N, in) = beta * dx + dy W, as base_forward.
void Decoder::Impl::base_backward_input(bf16_t* dx, const bf16_t* dy, const LinearRef& w, float beta) {
  if (!fused_nf4(w)) return mm(false, false, N, w.in, w.out, 1.0f, dy, base_weight(w), beta, dx, DType::BF16);
  Nf4GemmCall g;
  g.M = N, g.N = w.in, g.K = w.out, g.beta = beta, g.A = dy, g.codes = w.nf4_codes, g.scales = w.nf4_scales;
  g.w_transposed = false, g.C = dx, g.out = DType::BF16;
  nf4_gemm(g);
}

// y (N, out) = beta * y + x W^T [+ b] [+ s (x' A^T) B^T];  xa = x' A^T (N, r) saved; x' = dropout(x)
// with LoRA dropout, else x
void Decoder::Impl::linear_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta) {
  if (w.m) return dora_forward(y, x, w, xa, beta);
  base_forward(y, x, w, beta);
  if (w.a) {
    const bf16_t* xd = x;
    if (w.dropout > 0) {
      lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
      xd = dropped_x;
    }
    mm(false, true, N, w.r, w.in, 1.0f, xd, w.a, 0.0f, xa, DType::BF16);
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, y, DType::BF16);
  }
}

// Undoes y = x W^T + b + s (x' A^T) B^T: dx (N, in) overwritten (or += when accumulate; nullptr: not
// wanted), dW += dy^T x (trainable base only), db += column sums of dy (as ones (1, N) @ dy),
// dB += s dy^T xa, dA += g^T x' with g = s dy B, dx += mask (g A) / (1 - p) (x' = x without dropout:
// dx += g A). The dropout mask is redrawn from the same seed as the forward's.
// Every read of x comes before the first write of dx, so dx may be x itself (the MLP's d act over
// act): the weight gradients first, then dx = dy W (+ its LoRA part), in the order that sums dx.
void Decoder::Impl::linear_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x,
                                    const LinearRef& w, const bf16_t* xa) {
  if (w.m) return dora_backward(dx, accumulate, dy, x, w, xa);
  if (w.dw) mm(true, false, w.out, w.in, N, 1.0f, dy, x, 1.0f, w.dw, DType::F32);
  if (w.dbias) mm(false, false, 1, w.out, N, 1.0f, ones, dy, 1.0f, w.dbias, DType::F32);
  if (w.a) {
    mm(true, false, w.out, w.r, N, w.scale, dy, xa, 1.0f, w.db, DType::F32);
    mm(false, false, N, w.r, w.out, w.scale, dy, w.b, 0.0f, lora_g, DType::BF16);
    if (w.dropout > 0)  // x' again
      lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
    mm(true, false, w.r, w.in, N, 1.0f, lora_g, w.dropout > 0 ? dropped_x : x, 1.0f, w.da, DType::F32);
  }
  if (!dx) return;  // x is read no more
  base_backward_input(dx, dy, w, accumulate ? 1.0f : 0.0f);
  if (!w.a) return;
  if (w.dropout > 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = g A
    lora_dropout_backward_add(dx, dropped_x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
  } else {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dx, DType::BF16);
  }
}

// DoRA (LoraAdapter's, PEFT's): norm (out) = ‖W + s B A‖ per row, c = m / norm. weight: W (out, in)
// bf16 (base_weight's).
void Decoder::Impl::dora_norms(const LinearRef& w, const bf16_t* weight) { dora_norm_rows(w, weight, 0, w.out); }

// The same for W's rows [o0, o0 + rows) (rows: their bf16 values, (rows, in)).
void Decoder::Impl::dora_norm_rows(const LinearRef& w, const bf16_t* rows, int64_t o0, int64_t n) {
  dora_widen(dora_w, rows, n * w.in);
  mm(false, false, n, w.in, w.r, w.scale, w.b + o0 * w.r, w.a, 1.0f, dora_w, DType::F32);  // += s B[rows] @ A
  dora_weight_norm(w.norm + o0, w.c + o0, dora_w, w.m + o0, n, w.in);
}

// y (N, out) = beta * y + c ⊙ pre + b, pre = x W^T + s xa B^T, xa = x A^T (no dropout);
// y = beta * y + x W^T + b + c ⊙ pre − x' W^T, pre = x' W^T + s xa B^T, xa = x' A^T (dropout).
// pre, norm, c saved for the backward.
void Decoder::Impl::dora_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta) {
  const bf16_t* weight = base_weight(w);  // stays valid through this call (no other NF4 dequantisation)
  dora_norms(w, weight);
  const bf16_t* xd = x;
  if (w.dropout > 0) {
    lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
    xd = dropped_x;
  }
  mm(false, true, N, w.r, w.in, 1.0f, xd, w.a, 0.0f, xa, DType::BF16);
  if (w.dropout > 0) {
    mm(false, true, N, w.out, w.in, 1.0f, x, weight, beta, y, DType::BF16, w.bias);  // y = beta y + x W^T + b
    mm(false, true, N, w.out, w.in, 1.0f, xd, weight, 0.0f, dora_p1, DType::BF16);   // p1 = x' W^T
    KTUNE_CUDA_CHECK(
        cudaMemcpyAsync(w.pre, dora_p1, size_t(N * w.out) * 2, cudaMemcpyDeviceToDevice, nullptr));
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, w.pre, DType::BF16);  // pre = p1 + s xa B^T
    dora_combine(y, w.pre, dora_p1, w.c, nullptr, 1.0f, N, w.out);
  } else {
    mm(false, true, N, w.out, w.in, 1.0f, x, weight, 0.0f, w.pre, DType::BF16);  // pre = x W^T
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, w.pre, DType::BF16);  //     + s xa B^T
    dora_combine(y, w.pre, nullptr, w.c, w.bias, beta, N, w.out);
  }
}

// Undoes dora_forward (the norm detached, the base frozen): d = dy ⊙ c; dm += Σ_n dy ⊙ pre / norm;
// dB += s d^T xa; g = s d B; dA += g^T x'; dx (overwritten, or += when accumulate; nullptr: not
// wanted) = d W + g A (no dropout), or dy W + mask ⊙ (g A + ((c − 1) ⊙ dy) W) / (1 − p) (dropout).
// As linear_backward, every read of x before the first write of dx.
void Decoder::Impl::dora_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x,
                                  const LinearRef& w, const bf16_t* xa) {
  const bf16_t* weight = dx ? base_weight(w) : nullptr;  // valid through this call
  dora_scale_columns(dora_d, dy, w.c, 0.0f, N, w.out);  // d = dy ⊙ c
  dora_magnitude_grad(w.dm, dy, w.pre, w.norm, N, w.out);
  mm(true, false, w.out, w.r, N, w.scale, dora_d, xa, 1.0f, w.db, DType::F32);      // dB += s d^T xa
  mm(false, false, N, w.r, w.out, w.scale, dora_d, w.b, 0.0f, lora_g, DType::BF16);  // g = s d B
  if (w.dropout > 0)  // x' again
    lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
  mm(true, false, w.r, w.in, N, 1.0f, lora_g, w.dropout > 0 ? dropped_x : x, 1.0f, w.da, DType::F32);
  if (!dx) return;  // x is read no more
  mm(false, false, N, w.in, w.out, 1.0f, w.dropout > 0 ? dy : dora_d, weight, accumulate ? 1.0f : 0.0f, dx,
     DType::BF16);
  if (w.dropout <= 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dx, DType::BF16);
    return;
  }
  mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = g A
  dora_scale_columns(dora_d, dy, w.c, -1.0f, N, w.out);                             //   + ((c − 1) ⊙ dy) W
  mm(false, false, N, w.in, w.out, 1.0f, dora_d, weight, 1.0f, dropped_x, DType::BF16);
  lora_dropout_backward_add(dx, dropped_x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
}

}  // namespace ktune::cuda
