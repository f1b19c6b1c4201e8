#include "model/adapters/lora_adapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/random_bits.h"  // splitmix64, uniform01, fnv1a64: the masks the GPU step draws too
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/nf4.h"
#include "model/decoder.h"

namespace ktune::model {

namespace {

constexpr int64_t kRowBlock = 64;  // rows of x (dropout) or of W (DoRA norms) handled at a time

// ‖row‖ over n values, summed in double in order (DoRA's norms: the magnitudes, the scale, the merge
// all take this one, so that a magnitude made from W is the norm its merge divides by, bit for bit).
float row_norm(const float* row, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(row[i]) * row[i];
  return float(std::sqrt(sum));
}

}  // namespace

LoraAdapter::LoraAdapter(Linear& base, const LoraOptions& options)
    : module_(base.name), options_(options), in_(base.in), out_(base.out) {
  const int64_t r = options.rank;
  check(r >= 1, "lora_rank", "must be at least 1, got " + std::to_string(r));
  check(options.dropout >= 0.0f && options.dropout < 1.0f, "lora_dropout", "must be in [0, 1)");
  scale_ = options.use_rslora ? options.alpha / std::sqrt(float(r)) : options.alpha / float(r);

  const std::string prefix = "base_model.model." + module_;
  lora_a_.name = prefix + ".lora_A.weight";
  lora_a_.value = Tensor::empty({r, in_});
  lora_b_.name = prefix + ".lora_B.weight";
  lora_b_.value = Tensor::zeros({out_, r});
  // kaiming_uniform_(a=√5) on (r, in): bound = √(6 / ((1 + 5) · in)) = 1/√in
  const float bound = 1.0f / std::sqrt(float(in_));
  const uint64_t seed = splitmix64(options.seed ^ std::hash<std::string>{}(module_));
  float* a = lora_a_.value.f32();
  for (int64_t i = 0; i < r * in_; ++i) a[i] = (2.0f * uniform01(seed, uint64_t(i)) - 1.0f) * bound;

  if (options.quantize_base) nf4_.emplace(base, options.nf4_arithmetic, options.nf4_on_demand);
  if (options.use_dora) {
    magnitude_.name = prefix + ".lora_magnitude_vector";
    magnitude_.value = Tensor::zeros({out_});
    weight_norm_.resize(size_t(out_));
    dora_scale_.resize(size_t(out_));
    if (!options.dora_magnitudes_later) init_dora_magnitude(base);
  }
}

void LoraAdapter::init_dora_magnitude(const Linear& base) {
  check(options_.use_dora, module_, "has no DoRA magnitude to make");
  const Tensor w = base_weight(base);
  const float* rows = w.f32();  // (out, in)
  float* magnitude = magnitude_.value.f32();
  for (int64_t o = 0; o < out_; ++o) magnitude[o] = row_norm(rows + o * in_, in_);
}

std::vector<Parameter*> LoraAdapter::parameters() {
  std::vector<Parameter*> params = {&lora_a_, &lora_b_};
  if (options_.use_dora) params.push_back(&magnitude_);
  return params;
}

int64_t LoraAdapter::saved_floats(int64_t N) const {
  return N * options_.rank + (options_.use_dora ? N * out_ : 0);  // xa, and DoRA's pre-scale output
}

int64_t LoraAdapter::scratch_floats(int64_t N) const {
  int64_t floats = N * options_.rank;                           // g
  if (options_.use_dora) floats += N * out_;                    // dy ⊙ c
  if (options_.dropout > 0.0f) floats += N * in_;               // dropped x, then its gradient
  return floats;
}

void LoraAdapter::release_base() {
  if (nf4_) nf4_->release();
}

Tensor LoraAdapter::base_weight(const Linear& base) const {
  if (nf4_) return nf4_->dequantized(base);
  const Tensor& w = base.weight->value;
  if (w.dtype() == DType::F32 && !value_in_other_dtype(*base.weight)) return w;
  Tensor wide = Tensor::empty(w.shape());  // widened from bf16, or an f32 value read as its bf16 storage
  read_stored_f32(*base.weight, 0, w.numel(), wide.f32());
  return wide;
}

size_t LoraAdapter::base_weight_bytes(const Linear& base) const {
  if (nf4_) return nf4_->bytes();
  return base.weight->value.defined() ? base.weight->value.bytes() : 0;
}

void LoraAdapter::base_forward(float* y, const float* x, int64_t N, const Linear& base) {
  if (nf4_)
    nf4_->forward(y, x, N);
  else
    cpu::gemm(false, true, N, out_, in_, 1.0f, x, base.weight->value.f32(), 0.0f, y);
}

void LoraAdapter::base_backward_input(float* dx, const float* dy, int64_t N, const Linear& base, float* scratch) {
  if (nf4_)
    nf4_->backward_input(dx, dy, N);
  else
    cpu::gemm(false, false, N, in_, out_, 1.0f, dy, base.weight->value.f32(), 1.0f, dx);
}

void LoraAdapter::compute_dora_scale(const float* base_weight) {
  if (nf4_) nf4_->check_computes();
  // ‖W + s·B·A‖ per row, a block of rows at a time: rows = W[block] + s · B[block] @ A
  const int64_t r = options_.rank;
  std::vector<float>& rows = dropout_rows_;
  rows.resize(size_t(std::max<int64_t>(kRowBlock * in_, int64_t(rows.size()))));
  for (int64_t o0 = 0; o0 < out_; o0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, out_ - o0);
    if (nf4_)
      nf4_->dequantize_rows(rows.data(), o0, m);
    else
      std::memcpy(rows.data(), base_weight + o0 * in_, sizeof(float) * size_t(m * in_));
    cpu::gemm(false, false, m, in_, r, scale_, lora_b_.value.f32() + o0 * r, lora_a_.value.f32(), 1.0f, rows.data());
    for (int64_t o = 0; o < m; ++o) {
      weight_norm_[size_t(o0 + o)] = row_norm(rows.data() + o * in_, in_);
      dora_scale_[size_t(o0 + o)] = magnitude_.value.f32()[o0 + o] / weight_norm_[size_t(o0 + o)];
    }
  }
}

uint64_t LoraAdapter::dropout_seed() const {
  return splitmix64(options_.seed ^ splitmix64(dropout_key_) ^ fnv1a64(module_));
}

bool LoraAdapter::dropped(uint64_t seed, uint64_t index) const { return uniform01(seed, index) < options_.dropout; }

void LoraAdapter::apply_dropout(float* xd, const float* x, int64_t row_begin, int64_t rows) const {
  const float keep_scale = 1.0f / (1.0f - options_.dropout);
  const uint64_t seed = dropout_seed();
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t i = 0; i < in_; ++i) {
      uint64_t index = uint64_t((row_begin + n) * in_ + i);
      xd[n * in_ + i] = dropped(seed, index) ? 0.0f : x[n * in_ + i] * keep_scale;
    }
}

void LoraAdapter::forward(float* y, const float* x, int64_t N, const Linear& base, float* saved) {
  const int64_t r = options_.rank;
  float* xa = saved;                                          // (N, r) = x' Aᵀ, x' = dropout(x)
  float* pre = options_.use_dora ? saved + N * r : nullptr;  // DoRA: (N, out) = x' Wᵀ + s · xa Bᵀ
  const bool dropping = options_.dropout > 0.0f && training_;
  // before the dropout blocks: it borrows their buffer
  if (options_.use_dora) compute_dora_scale(options_.quantize_base ? nullptr : base.weight->value.f32());
  if (dropping) {
    dropout_rows_.resize(size_t(std::max<int64_t>(kRowBlock * in_, int64_t(dropout_rows_.size()))));
    for (int64_t n0 = 0; n0 < N; n0 += kRowBlock) {
      const int64_t m = std::min(kRowBlock, N - n0);
      apply_dropout(dropout_rows_.data(), x + n0 * in_, n0, m);
      cpu::gemm(false, true, m, r, in_, 1.0f, dropout_rows_.data(), lora_a_.value.f32(), 0.0f, xa + n0 * r);
      if (pre) base_forward(pre + n0 * out_, dropout_rows_.data(), m, base);  // x' Wᵀ
    }
  } else {
    cpu::gemm(false, true, N, r, in_, 1.0f, x, lora_a_.value.f32(), 0.0f, xa);
  }

  if (options_.use_dora) {
    // PEFT (lora/variants.py + dora.py):  y = base(x) + (c − 1) ⊙ x' Wᵀ + c ⊙ s · x' Aᵀ Bᵀ
    // (bias once, from base(x)). Without dropout x' = x and this is y = c ⊙ (x Wᵀ + s · x Aᵀ Bᵀ) + b.
    const float* bias = base.bias ? base.bias->value.f32() : nullptr;
    if (dropping) {
      base_forward(y, x, N, base);  // x Wᵀ
      for (int64_t i = 0; i < N * out_; ++i) y[i] -= pre[i];
    } else {
      base_forward(pre, x, N, base);
    }
    cpu::gemm(false, true, N, out_, r, scale_, xa, lora_b_.value.f32(), 1.0f, pre);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out_; ++o) {
        const float v = dora_scale_[size_t(o)] * pre[n * out_ + o] + (bias ? bias[o] : 0.0f);
        y[n * out_ + o] = dropping ? y[n * out_ + o] + v : v;
      }
    return;
  }
  if (nf4_) nf4_->forward(y, x, N, base.bias ? base.bias->value.f32() : nullptr);  // y = x Wᵀ + b
  cpu::gemm(false, true, N, out_, r, scale_, xa, lora_b_.value.f32(), 1.0f, y);  // y += s · xa Bᵀ
}

void LoraAdapter::backward(float* dx, const float* dy, const float* x, int64_t N, const Linear& base,
                           const float* saved, float* scratch) {
  const int64_t r = options_.rank;
  const float* xa = saved;
  float* g = scratch;  // (N, r)
  float* next = scratch + N * r;
  const bool dropping = options_.dropout > 0.0f && training_;

  // d: the gradient at the LoRA sum's output (dy, or dy ⊙ c for DoRA).
  const float* d = dy;
  float* dyc = nullptr;
  if (options_.use_dora) {
    dyc = next;
    next += N * out_;
    const float* pre = saved + N * r;
    float* dm = magnitude_.trainable && magnitude_.grad.defined() ? magnitude_.grad.f32() : nullptr;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < out_; ++o) dyc[n * out_ + o] = dy[n * out_ + o] * dora_scale_[size_t(o)];
    if (dm) {
      // y = m/‖·‖ ⊙ pre (+ terms without m)  ⇒  ∂y/∂m = pre / ‖·‖ (the norm detached)
      for (int64_t o = 0; o < out_; ++o) {
        double sum = 0;
        for (int64_t n = 0; n < N; ++n) sum += double(dy[n * out_ + o]) * pre[n * out_ + o];
        dm[o] += float(sum / weight_norm_[size_t(o)]);
      }
    }
    d = dyc;
  }

  if (lora_b_.grad.defined())  // dB += s · dᵀ @ xa   (out, r)
    cpu::gemm(true, false, out_, r, N, scale_, d, xa, 1.0f, lora_b_.grad.f32());
  cpu::gemm(false, false, N, r, out_, scale_, d, lora_b_.value.f32(), 0.0f, g);  // g = s · d @ B   (N, r)

  float* xd = dropping ? next : nullptr;  // (N, in)
  if (dropping) apply_dropout(xd, x, 0, N);
  if (lora_a_.grad.defined())  // dA += gᵀ @ dropout(x)   (r, in)
    cpu::gemm(true, false, r, in_, N, 1.0f, g, dropping ? xd : x, 1.0f, lora_a_.grad.f32());

  if (dx == nullptr) return;
  if (dropping) {
    // d/dx' = g @ A (+ DoRA: ((c − 1) ⊙ dy) @ W), then dx += mask ⊙ d/dx' / keep
    cpu::gemm(false, false, N, in_, r, 1.0f, g, lora_a_.value.f32(), 0.0f, xd);  // xd now holds g @ A
    if (options_.use_dora) {
      for (int64_t i = 0; i < N * out_; ++i) dyc[i] -= dy[i];  // dy ⊙ (c − 1)
      base_backward_input(xd, dyc, N, base, nullptr);
    }
    const float keep_scale = 1.0f / (1.0f - options_.dropout);
    const uint64_t seed = dropout_seed();
    for (int64_t i = 0; i < N * in_; ++i)
      if (!dropped(seed, uint64_t(i))) dx[i] += xd[i] * keep_scale;
  } else {
    cpu::gemm(false, false, N, in_, r, 1.0f, g, lora_a_.value.f32(), 1.0f, dx);  // dx += g @ A
  }
  // The base path: dx += dy @ W (DoRA without dropout: (dy ⊙ c) @ W).
  if (replaces_base()) base_backward_input(dx, options_.use_dora && !dropping ? d : dy, N, base, nullptr);
}

size_t LoraAdapter::fused_output_scratch_floats(int64_t chunk_tokens) const {
  cpu::OutputHead head;
  head.rank = options_.rank;
  head.nf4_codes = nf4_ ? nf4_->codes() : nullptr;
  head.dora = options_.use_dora;
  return cpu::linear_cross_entropy_scratch_floats(chunk_tokens, out_, in_, head);
}

double LoraAdapter::fused_output_cross_entropy(float* dhidden, int64_t* n_valid, const float* hidden,
                                               const float* base_weight, const int32_t* labels, int64_t N,
                                               float softcap, float grad_scale, bool backward, int64_t chunk_tokens,
                                               float* scratch) {
  const int64_t r = options_.rank, C = in_;
  const bool dropping = options_.dropout > 0.0f && training_;
  check(nf4_ || base_weight != nullptr, module_, "the fused loss needs the f32 base weight");
  if (nf4_) nf4_->check_computes();
  // xa (N, r) = dropout(hidden) Aᵀ, once for all rows (ignored rows cost N·C·r, small beside the head).
  head_xa_.resize(size_t(N * r));
  // DoRA with dropout: PEFT's base term (c − 1) ⊙ x' Wᵀ needs the dropped rows x' (N, C) themselves.
  const bool dropped_base = options_.use_dora && dropping;
  if (dropped_base) {
    head_dropped_.resize(size_t(N * C));
    apply_dropout(head_dropped_.data(), hidden, 0, N);
    cpu::gemm(false, true, N, r, C, 1.0f, head_dropped_.data(), lora_a_.value.f32(), 0.0f, head_xa_.data());
  } else if (dropping) {
    dropout_rows_.resize(size_t(std::max<int64_t>(kRowBlock * C, int64_t(dropout_rows_.size()))));
    for (int64_t n0 = 0; n0 < N; n0 += kRowBlock) {
      const int64_t m = std::min(kRowBlock, N - n0);
      apply_dropout(dropout_rows_.data(), hidden + n0 * C, n0, m);
      cpu::gemm(false, true, m, r, C, 1.0f, dropout_rows_.data(), lora_a_.value.f32(), 0.0f, head_xa_.data() + n0 * r);
    }
  } else {
    cpu::gemm(false, true, N, r, C, 1.0f, hidden, lora_a_.value.f32(), 0.0f, head_xa_.data());
  }
  if (options_.use_dora) compute_dora_scale(options_.quantize_base ? nullptr : base_weight);

  cpu::OutputHead head;
  head.weight = nf4_ ? nullptr : base_weight;
  head.nf4_codes = nf4_ ? nf4_->codes() : nullptr;
  head.nf4_scales = nf4_ ? &nf4_->scales() : nullptr;
  head.nf4_arithmetic = options_.nf4_arithmetic;
  head.rank = r;
  head.lora_b = lora_b_.value.f32();
  head.lora_scale = scale_;
  head.xa = head_xa_.data();
  if (backward) {
    head_dxa_.resize(size_t(N * r));
    head.dxa = head_dxa_.data();
    head.dlora_b = lora_b_.trainable && lora_b_.grad.defined() ? lora_b_.grad.f32() : nullptr;
  }
  if (options_.use_dora) {
    head.dora = true;
    head.dora_scale = dora_scale_.data();
    head.weight_norm = weight_norm_.data();
    if (backward && magnitude_.trainable && magnitude_.grad.defined()) head.dmagnitude = magnitude_.grad.f32();
  }
  if (dropped_base) {
    head.dropped_hidden = head_dropped_.data();
    if (backward && dhidden) {
      head_ddropped_.resize(size_t(N * C));
      head.ddropped_hidden = head_ddropped_.data();
    }
  }
  const double loss = cpu::linear_cross_entropy(backward ? dhidden : nullptr, nullptr, n_valid, hidden, head, labels, N,
                                                C, out_, softcap, grad_scale, chunk_tokens, scratch);
  if (!backward) return loss;

  // Through xa = x' Aᵀ:  dA += dxaᵀ x',  dhidden += mask ⊙ (dxa A) / keep  (x' = x without dropout)
  const float* dxa = head_dxa_.data();
  float* dA = lora_a_.trainable && lora_a_.grad.defined() ? lora_a_.grad.f32() : nullptr;
  if (!dropping) {
    if (dA) cpu::gemm(true, false, r, C, N, 1.0f, dxa, hidden, 1.0f, dA);
    if (dhidden) cpu::gemm(false, false, N, C, r, 1.0f, dxa, lora_a_.value.f32(), 1.0f, dhidden);
    return loss;
  }
  const float keep_scale = 1.0f / (1.0f - options_.dropout);
  const uint64_t seed = dropout_seed();
  if (dropped_base) {
    // dx' = ((c − 1) ⊙ dz) W (from the kernel) + dxa A;  dhidden += mask ⊙ dx' / keep
    if (dA) cpu::gemm(true, false, r, C, N, 1.0f, dxa, head_dropped_.data(), 1.0f, dA);
    if (dhidden) {
      float* dxd = head_ddropped_.data();
      cpu::gemm(false, false, N, C, r, 1.0f, dxa, lora_a_.value.f32(), 1.0f, dxd);
      for (int64_t i = 0; i < N * C; ++i)
        if (!dropped(seed, uint64_t(i))) dhidden[i] += dxd[i] * keep_scale;
    }
    return loss;
  }
  float* rows = dropout_rows_.data();  // (kRowBlock, C)
  for (int64_t n0 = 0; n0 < N; n0 += kRowBlock) {
    const int64_t m = std::min(kRowBlock, N - n0);
    if (dA) {
      apply_dropout(rows, hidden + n0 * C, n0, m);
      cpu::gemm(true, false, r, C, m, 1.0f, dxa + n0 * r, rows, 1.0f, dA);
    }
    if (dhidden) {
      cpu::gemm(false, false, m, C, r, 1.0f, dxa + n0 * r, lora_a_.value.f32(), 0.0f, rows);
      for (int64_t i = 0; i < m * C; ++i)
        if (!dropped(seed, uint64_t(n0 * C + i))) dhidden[n0 * C + i] += rows[i] * keep_scale;
    }
  }
  return loss;
}

Tensor LoraAdapter::merged_weight(const Linear& base) const {
  Tensor w = base_weight(base);  // widened, dequantised: a tensor of its own; an f32 base: the value itself
  if (base.weight->value.defined() && w.raw() == base.weight->value.raw()) w = w.clone();
  cpu::gemm(false, false, out_, in_, options_.rank, scale_, lora_b_.value.f32(), lora_a_.value.f32(), 1.0f, w.f32());
  if (options_.use_dora) {
    for (int64_t o = 0; o < out_; ++o) {
      float* row = w.f32() + o * in_;
      const float c = magnitude_.value.f32()[o] / row_norm(row, in_);
      for (int64_t i = 0; i < in_; ++i) row[i] *= c;
    }
  }
  return w;
}

std::string module_suffix(const std::string& module) { return module.substr(module.rfind('.') + 1); }

std::vector<std::string> lora_target_modules(const LoraTargets& targets) {
  std::vector<std::string> modules;
  for (const std::string& m : targets.attn_modules) {
    if (m == "q_proj" || m == "k_proj" || m == "v_proj") modules.push_back(m);
    else if (m == "output_proj" || m == "o_proj") modules.push_back("o_proj");
    else throw Error("model.lora_attn_modules", "unknown module '" + m + "' (expected q_proj, k_proj, v_proj or output_proj)");
  }
  if (targets.apply_to_mlp)
    for (const char* m : {"gate_proj", "up_proj", "down_proj"}) modules.push_back(m);
  if (targets.apply_to_output) modules.push_back("lm_head");
  return modules;
}

std::vector<std::shared_ptr<LoraAdapter>> attach_lora(Decoder& decoder, const LoraTargets& targets,
                                                      const LoraOptions& options) {
  std::vector<std::string> wanted = lora_target_modules(targets);
  check(!wanted.empty(), "model.lora_attn_modules", "no module selected for LoRA");
  // As torchtune: a tied head is the embedding table, with no output projection of its own.
  if (targets.apply_to_output)
    check(!decoder.config().tie_word_embeddings, "model.apply_lora_to_output",
          "this model ties its output layer to the embeddings (tie_word_embeddings in config.json), so there is no "
          "separate output projection for LoRA; set apply_lora_to_output=False");
  std::vector<std::shared_ptr<LoraAdapter>> adapters;
  for (Linear* linear : decoder.linears()) {
    if (std::find(wanted.begin(), wanted.end(), module_suffix(linear->name)) == wanted.end()) continue;
    auto adapter = std::make_shared<LoraAdapter>(*linear, options);
    linear->adapter = adapter;
    adapters.push_back(adapter);
  }
  decoder.adapters_changed();
  decoder.set_trainable([](const std::string& name) { return name.rfind("base_model.model.", 0) == 0; });
  return adapters;
}

}  // namespace ktune::model
