// A layer projection without LoRA whose frozen base is NF4 all the same: torchtune's FrozenNF4Linear,
// which its Llama 3.x, Mistral and Gemma 2 QLoRA builders put in place of every layer projection
// that carries no adapter (the unadapted k_proj of its QLoRA configs, the MLP when
// apply_lora_to_mlp=False). Its Qwen2 builders keep those in the model's dtype, and no builder
// quantises lm_head or the embeddings, so neither does this. y = x Wᵀ + b with W dequantised from
// torchao's NF4 (Nf4Base), no trainable parameter; a save writes W as its dequantised NF4, as
// torchtune's state-dict hook does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/nf4.h"
#include "model/adapters/nf4_base.h"
#include "model/config.h"
#include "model/linear.h"

namespace ktune::model {

class Decoder;

class FrozenNf4Adapter : public LinearAdapter {
 public:
  // Quantises base's weight and frees it (Nf4Base), unless on_demand.
  FrozenNf4Adapter(Linear& base, cpu::Nf4Arithmetic arithmetic, bool on_demand);

  std::vector<Parameter*> parameters() override { return {}; }
  bool replaces_base() const override { return true; }
  void forward(float* y, const float* x, int64_t N, const Linear& base, float* saved) override;
  void backward(float* dx, const float* dy, const float* x, int64_t N, const Linear& base, const float* saved,
                float* scratch) override;

  const std::string& module_name() const { return module_; }
  // W (out, in) as a plain Linear would need it: the dequantised NF4 (what a merged save writes).
  Tensor merged_weight(const Linear& base) const { return nf4_.dequantized(base); }
  size_t base_weight_bytes() const { return nf4_.bytes(); }  // the NF4 codes and scales held
  void release_base() { nf4_.release(); }  // as LoraAdapter::release_base

 private:
  std::string module_;
  Nf4Base nf4_;
};

// Whether torchtune's QLoRA builders for this family quantise the layer projections that carry no
// adapter: Llama, Mistral and Gemma 2 yes (FrozenNF4Linear), Qwen2 / Qwen2.5 no (nn.Linear).
bool qlora_quantizes_unadapted(Family family);

// Attaches a FrozenNf4Adapter to every projection of the decoder's layers that carries no adapter
// yet (after attach_lora; lm_head is not a layer projection). Returns them in module order.
std::vector<std::shared_ptr<FrozenNf4Adapter>> attach_frozen_nf4(Decoder& decoder, cpu::Nf4Arithmetic arithmetic,
                                                                 bool on_demand);

}  // namespace ktune::model
