// LoRA, DoRA and QLoRA as one adapter on a model::Linear (the decoder's hook, model/linear.h).
//   LoRA:  y = base(x) + s · B(A(dropout(x)))                     s = alpha / r (alpha / √r: rsLoRA)
//   DoRA:  y = c ⊙ (x Wᵀ + s · B(A x)) + b,   c = m / ‖W + s·B·A‖_row  (the norm detached, as PEFT)
//          with dropout (PEFT's variant): y = x Wᵀ + b + (c − 1) ⊙ x' Wᵀ + c ⊙ s · B(A x'), x' = dropout(x)
//   QLoRA: the base W kept only in NF4 (Nf4Base: torchao's, as torchtune's QLoRA: blocks of 64,
//          double-quantised scales held as its int8 scalers; kernels/cpu/nf4.h): the f32 (or bf16) weight is
//          freed when the adapter attaches and never rebuilt whole in training. (The projections QLoRA
//          leaves without LoRA: FrozenNf4Adapter.)
// Parameters are named as PEFT names them (`base_model.model.<module>.lora_A.weight`, `…lora_B.weight`,
// `…lora_magnitude_vector`), so saving an adapter is writing parameters() as they are.
// Init as PEFT: A kaiming-uniform (bound 1/√in), B zero, m the row norms of W.
// Dropout masks are a pure function of (seed, key, module name, element index) — splitmix64 and
// FNV-1a, written out so that a reference can redraw them (tests/train/peft_steps).
// On the output projection (lm_head, untied heads only) the decoder's loss never materialises the
// logits: fused_output_cross_entropy() runs the chunked fused loss (kernels/cpu/cross_entropy.h)
// with the low-rank term, the NF4 base (dequantised a block of vocabulary rows at a time) and the
// DoRA column scale inside it (DoRA with dropout there keeps the dropped rows and their gradient,
// 2 · N · C floats, for PEFT's (c − 1) ⊙ x' Wᵀ term).
// It deliberately does not implement adapters other than LoRA/DoRA/QLoRA (no bias training, no
// rank patterns per module).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <optional>

#include "kernels/cpu/nf4.h"
#include "model/adapters/nf4_base.h"
#include "model/linear.h"

namespace ktune::model {

class Decoder;

struct LoraOptions {
  int64_t rank = 8;
  float alpha = 16.0f;
  float dropout = 0.0f;
  bool use_dora = false;
  bool use_rslora = false;
  bool quantize_base = false;  // QLoRA: NF4 base
  // QLoRA: the arithmetic its NF4 is made and read in, torchao's in the dtype torchtune's model holds
  // the base in (kernels/cpu/nf4.h): bf16 under dtype=bf16 (and for a GPU's host model), f32 under fp32.
  cpu::Nf4Arithmetic nf4_arithmetic = cpu::Nf4Arithmetic::kBf16;
  uint64_t seed = 0;
  // QLoRA on a host model that never computes (a GPU run's: its GPU quantises its own copy of the
  // base): the base stays the Linear's value (a view of a mapped checkpoint) and NF4 codes are made
  // only when base_weight() or merged_weight() needs them, one projection at a time: the codes the
  // eager path holds, without holding them (0.56 bytes a base value, 39 GB at 70B) or making them
  // at load on every rank. The passes refuse.
  bool nf4_on_demand = false;
  // DoRA: the magnitudes are left 0 at construction, made by init_dora_magnitude() later: the ranks
  // of a distributed run each make a share of the adapters' and sum them (share_dora_magnitudes),
  // where every rank would otherwise read every adapted base in full (QLoRA's quantised and
  // dequantised: the whole model's quantising on every rank).
  bool dora_magnitudes_later = false;
};

class LoraAdapter : public LinearAdapter {
 public:
  // Attaches nothing by itself: attach_lora() sets base.adapter. Quantises the base (and frees its
  // weight) when options.quantize_base: an f32 base, or a bf16 one (a GPU run's host model; its
  // codes are those of its values widened to f32). The passes (forward, backward, the fused loss)
  // compute on an f32 base: the CPU engine stores DoRA's and QLoRA's bases f32.
  LoraAdapter(Linear& base, const LoraOptions& options);

  std::vector<Parameter*> parameters() override;
  int64_t saved_floats(int64_t N) const override;
  int64_t scratch_floats(int64_t N) const override;
  bool replaces_base() const override { return options_.use_dora || options_.quantize_base; }
  void forward(float* y, const float* x, int64_t N, const Linear& base, float* saved) override;
  void backward(float* dx, const float* dy, const float* x, int64_t N, const Linear& base, const float* saved,
                float* scratch) override;

  // Dropout masks are a pure function of (seed, key, element): the trainer sets a new key per
  // micro-batch, so a recomputed forward (activation checkpointing) draws the same mask.
  void set_dropout_key(uint64_t key) { dropout_key_ = key; }
  void set_training(bool training) { training_ = training; }

  float scale() const { return scale_; }
  const LoraOptions& options() const { return options_; }
  const std::string& module_name() const { return module_; }
  // The base weight as f32 (dequantised for QLoRA, widened from a bf16 base, an f32 value stored bf16
  // read as its bf16 rounding: Parameter::stored_dtype): (out, in).
  Tensor base_weight(const Linear& base) const;
  // W' that a plain Linear would need to compute what this adapter computes: (out, in).
  Tensor merged_weight(const Linear& base) const;
  // DoRA: the magnitudes at their start, the row norms of the base weight (B = 0, so ‖W + sBA‖ = ‖W‖),
  // made at construction unless LoraOptions::dora_magnitudes_later.
  void init_dora_magnitude(const Linear& base);
  // Bytes the adapter holds of the base: QLoRA's NF4 codes + scales (none made on demand: the base is
  // the Linear's value then, counted with the model's); otherwise the Linear's weight (0 once released).
  size_t base_weight_bytes(const Linear& base) const;
  // QLoRA: frees the NF4 codes and scales (and their scratch) for a host model that neither computes
  // nor saves a merged model any more (a GPU run's ranks other than 0: the GPU holds its own codes).
  // base_weight, merged_weight and every pass refuse afterwards, naming the module. LoRA/DoRA: the
  // base is the Linear's value, which Decoder::release_values frees; nothing to do here.
  void release_base();

  // The output projection (this adapter on lm_head) fused with cross-entropy, as
  // cpu::linear_cross_entropy: returns the sum of CE over valid labels, *n_valid their count.
  // hidden (N, C) the final normed hidden states; base_weight (V, C) the f32 base weight (ignored
  // for QLoRA, whose NF4 copy is used); labels (N), -100 ignored. backward: dhidden (N, C) or
  // nullptr overwritten with grad_scale · d(sum)/d(hidden) (base and adapter paths, 0 on ignored
  // rows), and the adapter's gradients accumulated. Dropout (training) masks element n·C + i of hidden.
  double fused_output_cross_entropy(float* dhidden, int64_t* n_valid, const float* hidden, const float* base_weight,
                                    const int32_t* labels, int64_t N, float softcap, float grad_scale, bool backward,
                                    int64_t chunk_tokens, float* scratch);
  // Floats of scratch fused_output_cross_entropy needs for chunks of chunk_tokens tokens.
  size_t fused_output_scratch_floats(int64_t chunk_tokens) const;

 private:
  void base_forward(float* y, const float* x, int64_t N, const Linear& base);  // y = x Wᵀ (no bias)
  void base_backward_input(float* dx, const float* dy, int64_t N, const Linear& base, float* scratch);  // dx += dy W
  // weight_norm_, dora_scale_ from the f32 base weight (out, in), or the NF4 copy when quantised
  void compute_dora_scale(const float* base_weight);
  void apply_dropout(float* xd, const float* x, int64_t row_begin, int64_t rows) const;
  // The mask's seed for the current key; element `index` of x (N, in) is dropped when
  // dropped(seed, index). One definition, so the backward redraws exactly the forward's mask.
  uint64_t dropout_seed() const;
  bool dropped(uint64_t seed, uint64_t index) const;

  std::string module_;
  LoraOptions options_;
  int64_t in_ = 0, out_ = 0;
  float scale_ = 1.0f;
  Parameter lora_a_, lora_b_, magnitude_;
  std::optional<Nf4Base> nf4_;  // QLoRA's base (options_.quantize_base)
  // DoRA: per output row, ‖W + sBA‖ and m / ‖·‖ (recomputed each forward; the weights do not
  // change between a forward and its backward)
  std::vector<float> weight_norm_, dora_scale_;
  std::vector<float> dropout_rows_;  // forward-only block buffer for dropped inputs
  std::vector<float> head_xa_, head_dxa_;  // lm_head: (N, r) dropout(hidden) Aᵀ and its gradient
  std::vector<float> head_dropped_, head_ddropped_;  // lm_head, DoRA with dropout: (N, C) x' and its gradient
  uint64_t dropout_key_ = 0;
  bool training_ = true;
};

// torchtune's LoRA targets: lora_attn_modules ⊂ {q_proj, k_proj, v_proj, output_proj},
// apply_lora_to_mlp (gate/up/down), apply_lora_to_output (lm_head; refused for tied embeddings, as
// torchtune refuses it).
struct LoraTargets {
  std::vector<std::string> attn_modules = {"q_proj", "v_proj"};
  bool apply_to_mlp = false;
  bool apply_to_output = false;
};

// Attaches adapters to the matching projections, freezes every base parameter, and makes the
// adapters' parameters the trainable ones. Returns the adapters in module order.
std::vector<std::shared_ptr<LoraAdapter>> attach_lora(Decoder& decoder, const LoraTargets& targets,
                                                      const LoraOptions& options);

// The last part of a module name ("q_proj" of "model.layers.0.self_attn.q_proj"): what PEFT's
// target_modules names and matches.
std::string module_suffix(const std::string& module);

// HF module suffixes ("q_proj", "o_proj", "gate_proj", …) that the targets select (for
// adapter_config.json's target_modules).
std::vector<std::string> lora_target_modules(const LoraTargets& targets);

}  // namespace ktune::model
