// A PEFT adapter directory (adapter_config.json + adapter_model.safetensors, as PEFT's
// save_pretrained and ktune's checkpointer write it) put on a decoder, so that its forward computes
// what PEFT's PeftModel.from_pretrained(base, dir) computes: LoRA, rsLoRA and DoRA on any of the
// projections target_modules names (a list of module-name suffixes: q_proj … down_proj, lm_head).
// For `ktune generate --adapter`: a run saved with save_adapter_weights_only has no merged model.
// Deliberately refused, naming the key: other PEFT types, a regex or "all-linear" target_modules,
// rank_pattern / alpha_pattern, fan_in_fan_out, trained biases, modules_to_save, a tied lm_head.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"

namespace ktune::model {

struct PeftAdapterConfig {
  LoraOptions options;                      // rank, alpha, use_dora, use_rslora (dropout 0: inference)
  std::vector<std::string> target_modules;  // module-name suffixes
};

// dir/adapter_config.json; errors name the file and the key.
PeftAdapterConfig read_peft_adapter_config(const std::string& dir);

// Attaches an adapter to each targeted projection of `decoder` and fills its parameters from
// dir/adapter_model.safetensors: every tensor the adapters need must be there with their shape, and
// every tensor there must be one of them (errors name the file and the tensor). The decoder computes
// with the adapters from then on (for training, attach_lora instead).
std::vector<std::shared_ptr<LoraAdapter>> load_peft_adapter(Decoder& decoder, const std::string& dir);

}  // namespace ktune::model
