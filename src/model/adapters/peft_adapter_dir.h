// A PEFT adapter directory (adapter_config.json + adapter_model.safetensors, as PEFT's
// save_pretrained and ktune's checkpointer write it) put on a decoder, so that its forward computes
// what PEFT's PeftModel.from_pretrained(base, dir) computes: LoRA, rsLoRA and DoRA on any of the
// projections target_modules names, by PEFT's rule: a list entry names a module exactly or ends its
// dotted name (q_proj, self_attn.q_proj, model.layers.0.self_attn.q_proj: what PEFT saves for
// "all-linear"), a string is a regular expression the whole name must match.
// For `ktune generate --adapter`: a run saved with save_adapter_weights_only has no merged model.
// Deliberately refused, naming the key: other PEFT types, an unexpanded "all-linear",
// rank_pattern / alpha_pattern, fan_in_fan_out, trained biases, modules_to_save, a tied lm_head.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"

namespace ktune::model {

struct PeftAdapterConfig {
  LoraOptions options;                      // rank, alpha, use_dora, use_rslora (dropout 0: inference)
  std::vector<std::string> target_modules;  // module names or dotted suffixes of them (a list)
  std::optional<std::string> target_regex;  // or a regular expression over the whole name (a string)
};

// Whether PEFT puts an adapter on the module `name` ("model.layers.0.self_attn.q_proj", "lm_head").
bool peft_targets(const PeftAdapterConfig& config, const std::string& name);

// dir/adapter_config.json; errors name the file and the key.
PeftAdapterConfig read_peft_adapter_config(const std::string& dir);

// Attaches an adapter to each targeted projection of `decoder` and fills its parameters from
// dir/adapter_model.safetensors: every tensor the adapters need must be there with their shape, and
// every tensor there must be one of them (errors name the file and the tensor). The decoder computes
// with the adapters from then on (for training, attach_lora instead).
std::vector<std::shared_ptr<LoraAdapter>> load_peft_adapter(Decoder& decoder, const std::string& dir);

}  // namespace ktune::model
