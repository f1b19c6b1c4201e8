// Fused output projection + cross-entropy in chunks (see cross_entropy.h). A chunk is up to
// chunk_tokens tokens with valid labels, gathered from wherever they sit among the ignored ones
// (a prompt-masked batch has short runs of answer tokens: one GEMM per run would read the whole
// (V, C) weight once per run), so ignored tokens cost nothing and each chunk's GEMMs are as tall as
// the chunk. Per chunk, in scratch (rows, V):
//   logits = hidden @ W^T;  [z = cap tanh(logits/cap)];  lse;  loss += lse - z[label]
//   dlogits = grad_scale (softmax(z) - onehot) [* (1 - (z/cap)^2)]   (in place)
//   dhidden = dlogits @ W;  dW += dlogits^T @ hidden   (an f32 W: both a block of vocabulary rows at a time)
// An adapted head (OutputHead) adds, per chunk:  logits += s · xa Bᵀ, or for DoRA
//   pre = h' Wᵀ + s · xa Bᵀ;  logits = h Wᵀ − h' Wᵀ + c ⊙ pre   (h' = h without dropout: logits = c ⊙ pre)
// and in the backward  [dm += Σ dlogits ⊙ pre / ‖·‖; dlogits *= c]  dxa = s · dlogits B,
// dB += s · dlogitsᵀ xa, with the NF4 base through nf4_linear_forward / _backward_input.
// The bf16 head (linear_cross_entropy_bf16) runs the same chunks on bf16 operands: hidden rows and
// dlogits rounded to bf16 (round to nearest even), W read as stored; dW in blocks of vocabulary rows.
#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "kernels/cpu/bf16_rounding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cpu/vector_math.h"

namespace ktune::cpu {

namespace {

// A chunk's logits z (rows, V) in place: [z = cap tanh(z/cap)]; row_loss[i] = lse(z_i) - z_i[label];
// with want_grad, z becomes grad_scale (softmax(z) - onehot) [* (1 - (z/cap)^2)]. Row i's label is
// labels[chunk_rows[i]].
void softmax_cross_entropy_rows(float* logits, double* row_loss, const int32_t* labels, const int64_t* chunk_rows,
                                int64_t rows, int64_t V, float softcap, float grad_scale, bool want_grad) {
  const float inv_cap = softcap > 0 ? 1.0f / softcap : 0.0f;
  parallel_for(rows, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      float* z = logits + i * V;
      const int32_t label = labels[chunk_rows[size_t(i)]];
      if (softcap > 0) {
#pragma omp simd
        for (int64_t c = 0; c < V; ++c) z[c] = softcap * vtanh(z[c] * inv_cap);
      }
      float m = -INFINITY;
#pragma omp simd reduction(max : m)
      for (int64_t c = 0; c < V; ++c) m = std::max(m, z[c]);
      float sum = 0.0f;
      if (want_grad) {
        const float z_label = z[label];
        if (softcap > 0) {
          // z holds the capped logits; cap'(.) = 1 - (z/cap)^2 is read before z is overwritten.
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < V; ++c) sum += vexp(z[c] - m);
          const float inv_sum = grad_scale / sum;
#pragma omp simd
          for (int64_t c = 0; c < V; ++c) {
            float t = z[c] * inv_cap;
            z[c] = vexp(z[c] - m) * inv_sum * (1.0f - t * t);
          }
          const float t = z_label * inv_cap;
          z[label] -= grad_scale * (1.0f - t * t);
        } else {
#pragma omp simd reduction(+ : sum)
          for (int64_t c = 0; c < V; ++c) {
            float e = vexp(z[c] - m);
            z[c] = e;
            sum += e;
          }
          const float inv_sum = grad_scale / sum;
#pragma omp simd
          for (int64_t c = 0; c < V; ++c) z[c] *= inv_sum;
          z[label] -= grad_scale;
        }
        row_loss[i] = double(m + std::log(sum)) - double(z_label);
      } else {
#pragma omp simd reduction(+ : sum)
        for (int64_t c = 0; c < V; ++c) sum += vexp(z[c] - m);
        row_loss[i] = double(m + std::log(sum)) - double(z[label]);
      }
    }
  }, std::max<int64_t>(1, 65536 / V));
}

// x (N, width): the rows of ignored tokens zeroed (their gradient is zero).
void zero_ignored_rows(float* x, const int32_t* labels, int64_t N, int64_t width) {
  for (int64_t r = 0; r < N; ++r)
    if (labels[r] == kIgnoreIndex) std::fill(x + r * width, x + (r + 1) * width, 0.0f);
}

// The next chunk: the indices of up to chunk_tokens labelled tokens from *r on into chunk_rows, *r
// moved past them. Returns how many (0: none left).
int64_t next_chunk(int64_t* chunk_rows, int64_t* r, const int32_t* labels, int64_t N, int64_t chunk_tokens) {
  int64_t rows = 0;
  for (; *r < N && rows < chunk_tokens; ++*r)
    if (labels[*r] != kIgnoreIndex) chunk_rows[rows++] = *r;
  return rows;
}

// The backward of a chunk's plain f32 projection, a block of vocabulary rows at a time:
//   dh = Σ_blocks dz[:, blk] W[blk]  (rows, C);   dW[blk] += dz[:, blk]ᵀ h  (blk, C)   (either may be null)
// Both GEMMs of a block read the same (rows, block) slice of dz while it is in cache, and each
// GEMM's own operand is a few MiB instead of the whole (V, C) weight or gradient: at 128256 x 512,
// ~230 rows, 8-10% faster than one dX and one dW GEMM over the whole vocabulary on two cores.
constexpr int64_t kHeadBackwardBlockRows = 8192;
void head_backward_blocked(float* dh, float* dweight, const float* dz, const float* h, const float* weight,
                           int64_t rows, int64_t C, int64_t V) {
  for (int64_t v0 = 0; v0 < V; v0 += kHeadBackwardBlockRows) {
    const int64_t block = std::min(kHeadBackwardBlockRows, V - v0);
    if (dh)  // (rows, block) @ (block, C)
      gemm_strided(false, false, rows, C, block, 1.0f, dz + v0, V, weight + v0 * C, C, v0 > 0 ? 1.0f : 0.0f, dh, C);
    if (dweight)  // (block, rows) @ (rows, C)
      gemm_strided(true, false, block, C, rows, 1.0f, dz + v0, V, h, C, 1.0f, dweight + v0 * C, C);
  }
}

// Tokens a chunk takes: the labelled tokens split evenly into as few chunks of at most chunk_tokens
// as hold them (470 labels at chunk_tokens 261: two chunks of 235, not 261 and 209; the GEMMs of a
// short last chunk run at a fraction of the rate).
int64_t balanced_chunk_tokens(const int32_t* labels, int64_t N, int64_t chunk_tokens) {
  int64_t labelled = 0;
  for (int64_t r = 0; r < N; ++r) labelled += labels[r] != kIgnoreIndex;
  if (labelled == 0) return chunk_tokens;
  const int64_t chunks = (labelled + chunk_tokens - 1) / chunk_tokens;
  return (labelled + chunks - 1) / chunks;
}

void check_labels(const int32_t* labels, int64_t N, int64_t V) {
  for (int64_t r = 0; r < N; ++r)
    if (labels[r] != kIgnoreIndex && (labels[r] < 0 || labels[r] >= V))
      throw Error("cross_entropy: token " + std::to_string(r),
                  "label " + std::to_string(labels[r]) + " outside [0, " + std::to_string(V) + ") and not -100");
}

}  // namespace

size_t linear_cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C) {
  return size_t(chunk_tokens * V + 2 * chunk_tokens * C);  // logits, gathered hidden, gathered dhidden
}

size_t linear_cross_entropy_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C, const OutputHead& head) {
  size_t floats = linear_cross_entropy_scratch_floats(chunk_tokens, V, C);
  floats += size_t(2 * chunk_tokens * head.rank);      // gathered xa, dxa
  if (head.dora) floats += size_t(chunk_tokens * (V + C));  // the unscaled projection; the dropped rows
  if (head.nf4_codes) floats += nf4_linear_scratch_floats(C, V);
  return floats;
}

double linear_cross_entropy(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                            const float* weight, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, float* scratch) {
  OutputHead head;
  head.weight = weight;
  return linear_cross_entropy(dhidden, dweight, n_valid, hidden, head, labels, N, C, V, softcap, grad_scale,
                              chunk_tokens, scratch);
}

double linear_cross_entropy(float* dhidden, float* dweight, int64_t* n_valid, const float* hidden,
                            const OutputHead& head, const int32_t* labels, int64_t N, int64_t C, int64_t V,
                            float softcap, float grad_scale, int64_t chunk_tokens, float* scratch) {
  check(chunk_tokens > 0, "cross_entropy", "chunk_tokens must be positive");
  const bool nf4 = head.weight == nullptr;
  check(!nf4 || (head.nf4_codes && head.nf4_scales), "cross_entropy", "the head has neither an f32 nor an NF4 weight");
  check(!(nf4 && dweight), "cross_entropy", "an NF4 head weight is frozen: no weight gradient");
  check(!(head.dora && dweight), "cross_entropy", "a DoRA head's base weight is frozen: no weight gradient");
  check(head.rank == 0 || (head.lora_b && head.xa), "cross_entropy", "a low-rank head needs B and xa");
  check(!head.dora || (head.rank > 0 && head.dora_scale && head.weight_norm), "cross_entropy",
        "a DoRA head needs the low-rank term, its scale and its norms");
  check(!head.dropped_hidden || head.dora, "cross_entropy", "dropped hidden rows are DoRA's (dropout) only");
  const int64_t R = head.rank;
  const bool dropped_base = head.dropped_hidden != nullptr;
  check_labels(labels, N, V);
  const bool want_grad = dhidden || dweight || head.dxa || head.dlora_b || head.dmagnitude || head.ddropped_hidden;
  double total = 0.0;
  int64_t count = 0;
  std::vector<double> row_loss(static_cast<size_t>(chunk_tokens));
  std::vector<int64_t> chunk_rows(static_cast<size_t>(chunk_tokens));  // the chunk's token indices
  float* logits = scratch;                               // (rows, V)
  float* h = scratch + chunk_tokens * V;                 // (rows, C) gathered hidden
  float* dh = h + chunk_tokens * C;                      // (rows, C) gathered dhidden
  float* xa = dh + chunk_tokens * C;                     // (rows, R) gathered xa
  float* dxa = xa + chunk_tokens * R;                    // (rows, R)
  float* pre = dxa + chunk_tokens * R;                   // DoRA: (rows, V) before the scale c
  float* hd = pre + (head.dora ? chunk_tokens * V : 0);  // DoRA: (rows, C) gathered h', then its gradient
  float* nf4_scratch = hd + (head.dora ? chunk_tokens * C : 0);
  // base(out, rows of in) = in Wᵀ, and its input gradient out = g W (overwritten)
  auto base_forward = [&](float* out, const float* in, int64_t rows) {
    if (nf4) nf4_linear_forward(out, in, head.nf4_codes, *head.nf4_scales, rows, C, V, head.nf4_arithmetic, nf4_scratch);
    else gemm(false, true, rows, V, C, 1.0f, in, head.weight, 0.0f, out);
  };
  auto base_backward = [&](float* out, const float* g, int64_t rows) {
    if (nf4) nf4_linear_backward_input(out, g, head.nf4_codes, *head.nf4_scales, rows, C, V, head.nf4_arithmetic, nf4_scratch,
                                       false);
    else gemm(false, false, rows, C, V, 1.0f, g, head.weight, 0.0f, out);  // (rows,V)@(V,C)
  };
  if (head.ddropped_hidden) zero_ignored_rows(head.ddropped_hidden, labels, N, C);
  const bool dora_grad = head.dora && head.dmagnitude;
  if (head.dxa) zero_ignored_rows(head.dxa, labels, N, R);
  if (dhidden) zero_ignored_rows(dhidden, labels, N, C);
  const int64_t rows_per_chunk = balanced_chunk_tokens(labels, N, chunk_tokens);
  int64_t r = 0;
  while (const int64_t rows = next_chunk(chunk_rows.data(), &r, labels, N, rows_per_chunk)) {
    for (int64_t i = 0; i < rows; ++i) std::copy_n(hidden + chunk_rows[size_t(i)] * C, C, h + i * C);
    base_forward(logits, h, rows);
    if (R > 0)
      for (int64_t i = 0; i < rows; ++i) std::copy_n(head.xa + chunk_rows[size_t(i)] * R, R, xa + i * R);
    if (head.dora) {
      // pre = h' Wᵀ + s · xa Bᵀ;  logits = h Wᵀ − h' Wᵀ + c ⊙ pre   (h' = h: logits = c ⊙ pre)
      if (dropped_base) {
        for (int64_t i = 0; i < rows; ++i) std::copy_n(head.dropped_hidden + chunk_rows[size_t(i)] * C, C, hd + i * C);
        base_forward(pre, hd, rows);
        for (int64_t i = 0; i < rows * V; ++i) logits[i] -= pre[i];  // h Wᵀ − h' Wᵀ
      } else {
        std::copy_n(logits, rows * V, pre);
        std::fill(logits, logits + rows * V, 0.0f);
      }
      gemm(false, true, rows, V, R, head.lora_scale, xa, head.lora_b, 1.0f, pre);  // += s · xa Bᵀ
      const float* c = head.dora_scale;
      parallel_for(rows, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          float* z = logits + i * V;
          const float* q = pre + i * V;
#pragma omp simd
          for (int64_t v = 0; v < V; ++v) z[v] += c[v] * q[v];
        }
      }, std::max<int64_t>(1, 65536 / V));
    } else if (R > 0) {
      gemm(false, true, rows, V, R, head.lora_scale, xa, head.lora_b, 1.0f, logits);  // += s · xa Bᵀ
    }
    softmax_cross_entropy_rows(logits, row_loss.data(), labels, chunk_rows.data(), rows, V, softcap, grad_scale, want_grad);
    for (int64_t i = 0; i < rows; ++i) total += row_loss[size_t(i)];
    count += rows;
    if (!want_grad) continue;
    if (head.dora) {
      // z = [h Wᵀ − h' Wᵀ +] c ⊙ pre:  dm += Σ_rows dz ⊙ pre / ‖·‖ (the norm detached); dpre = dz ⊙ c (in place)
      const float* c = head.dora_scale;
      if (dora_grad)
        parallel_for(V, [&](int64_t v0, int64_t v1) {
          for (int64_t v = v0; v < v1; ++v) {
            double sum = 0;
            for (int64_t i = 0; i < rows; ++i) sum += double(logits[i * V + v]) * pre[i * V + v];
            head.dmagnitude[v] += float(sum / head.weight_norm[v]);
          }
        }, 256);
      if (dropped_base && (dhidden || head.ddropped_hidden)) base_backward(dh, logits, rows);  // dz W: through h
      parallel_for(rows, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i) {
          float* z = logits + i * V;
#pragma omp simd
          for (int64_t v = 0; v < V; ++v) z[v] *= c[v];
        }
      }, std::max<int64_t>(1, 65536 / V));
      if (dropped_base && head.ddropped_hidden) {
        base_backward(hd, logits, rows);  // (c ⊙ dz) W, then − dz W: ((c − 1) ⊙ dz) W through h'
        for (int64_t i = 0; i < rows * C; ++i) hd[i] -= dh[i];
        for (int64_t i = 0; i < rows; ++i) std::copy_n(hd + i * C, C, head.ddropped_hidden + chunk_rows[size_t(i)] * C);
      }
    }
    // dh through h (DoRA with dropout computed it above); dW only for an f32 base that is not DoRA's.
    if (!nf4 && !dropped_base) head_backward_blocked(dhidden ? dh : nullptr, dweight, logits, h, head.weight, rows, C, V);
    else if (dhidden && !dropped_base) base_backward(dh, logits, rows);
    if (dhidden)
      for (int64_t i = 0; i < rows; ++i) std::copy_n(dh + i * C, C, dhidden + chunk_rows[size_t(i)] * C);
    if (R > 0 && head.dxa) {
      gemm(false, false, rows, R, V, head.lora_scale, logits, head.lora_b, 0.0f, dxa);  // s · dz B   (rows, R)
      for (int64_t i = 0; i < rows; ++i) std::copy_n(dxa + i * R, R, head.dxa + chunk_rows[size_t(i)] * R);
    }
    if (R > 0 && head.dlora_b) gemm(true, false, V, R, rows, head.lora_scale, logits, xa, 1.0f, head.dlora_b);  // (V, R)
  }
  if (n_valid) *n_valid = count;
  return total;
}

size_t linear_cross_entropy_bf16_scratch_floats(int64_t chunk_tokens, int64_t V, int64_t C) {
  return size_t(chunk_tokens * V + bf16_floats(chunk_tokens * V) + bf16_floats(chunk_tokens * C) +
                chunk_tokens * C + weight_gradient_block_rows(V, C) * C);
}

double linear_cross_entropy_bf16(float* dhidden, float* dweight, bf16_t* dweight_bf16, int64_t* n_valid,
                                 const float* hidden, const bf16_t* weight, const int32_t* labels, int64_t N,
                                 int64_t C, int64_t V, float softcap, float grad_scale, int64_t chunk_tokens,
                                 float* scratch) {
  check(chunk_tokens > 0, "cross_entropy", "chunk_tokens must be positive");
  check(!(dweight && dweight_bf16), "cross_entropy", "one weight gradient, f32 or bf16, not both");
  check_labels(labels, N, V);
  const bool want_grad = dhidden || dweight || dweight_bf16;
  std::vector<double> row_loss(static_cast<size_t>(chunk_tokens));
  std::vector<int64_t> chunk_rows(static_cast<size_t>(chunk_tokens));  // the chunk's token indices
  float* logits = scratch;                                                   // (rows, V)
  bf16_t* dz16 = as_bf16(logits + chunk_tokens * V);                         // (rows, V) bf16(dlogits)
  bf16_t* h16 = as_bf16(logits + chunk_tokens * V + bf16_floats(chunk_tokens * V));  // (rows, C) bf16(hidden)
  float* dh = logits + chunk_tokens * V + bf16_floats(chunk_tokens * V) + bf16_floats(chunk_tokens * C);  // (rows, C)
  float* block = dh + chunk_tokens * C;                                      // (block_rows, C) f32 dW rows
  if (dhidden) zero_ignored_rows(dhidden, labels, N, C);
  double total = 0.0;
  int64_t count = 0;
  const int64_t rows_per_chunk = balanced_chunk_tokens(labels, N, chunk_tokens);
  int64_t r = 0;
  while (const int64_t rows = next_chunk(chunk_rows.data(), &r, labels, N, rows_per_chunk)) {
    parallel_for(rows, [&](int64_t i0, int64_t i1) {  // gather and round: h16 = bf16(hidden[chunk_rows])
      for (int64_t i = i0; i < i1; ++i) {
        const float* src = hidden + chunk_rows[size_t(i)] * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) h16[i * C + c] = f32_to_bf16(src[c]);
      }
    }, std::max<int64_t>(1, 16384 / C));
    gemm_bf16(false, true, rows, V, C, 1.0f, h16, weight, 0.0f, logits);  // (rows,C)@(C,V)
    softmax_cross_entropy_rows(logits, row_loss.data(), labels, chunk_rows.data(), rows, V, softcap, grad_scale,
                               want_grad);
    for (int64_t i = 0; i < rows; ++i) total += row_loss[size_t(i)];
    count += rows;
    if (!want_grad) continue;
    round_to_bf16(dz16, logits, rows * V);
    if (dhidden) {
      gemm_bf16(false, false, rows, C, V, 1.0f, dz16, weight, 0.0f, dh);  // (rows,V)@(V,C)
      for (int64_t i = 0; i < rows; ++i) std::copy_n(dh + i * C, C, dhidden + chunk_rows[size_t(i)] * C);
    }
    if (dweight) gemm_bf16(true, false, V, C, rows, 1.0f, dz16, h16, 1.0f, dweight);  // (V,rows)@(rows,C)
    if (dweight_bf16) linear_backward_weight_bf16_blocks(dweight_bf16, dz16, h16, rows, C, V, block);  // += dz16ᵀ h16
  }
  if (n_valid) *n_valid = count;
  return total;
}

}  // namespace ktune::cpu
