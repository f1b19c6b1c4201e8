// The architectures of the public checkpoints ktune's runtimes fetch and torchtune's size-specific
// builders build (the fields of their Hugging Face config.json that shape the model), by config name
// ("llama3_2/1B", "qwen2_5/7B", "gemma2/27B", ...) or Hugging Face name ("meta-llama/Llama-3.2-1B",
// "Qwen/Qwen2.5-7B-Instruct", ...): what `ktune plan --model` sizes, and what a run checks a
// checkpoint against when its config names a builder such as lora_llama3_2_1b.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "model/config.h"

namespace ktune::train {

// The known model `name` names (a config name or a Hugging Face name), if any.
std::optional<model::ModelConfig> known_model(const std::string& name);
// The config names known_model knows, sorted.
std::vector<std::string> known_model_names();

// A size-specific builder (model._component_ torchtune.models.llama3_2.lora_llama3_2_1b: family
// "llama3_2", size "1B") builds that model's architecture whatever the checkpoint holds; torchtune
// then fails loading the state dict. A checkpoint of another shape (config.json at `config_path`)
// is refused before anything loads, naming both shapes and the builders that take any config.json.
// Builders of a size known_model does not hold (llama3_1/405B, qwen2_5/72B, ...) are not checked.
void check_builder_matches_checkpoint(const std::string& component, const std::string& family,
                                      const std::string& size, const model::ModelConfig& checkpoint,
                                      const std::string& config_path);

}  // namespace ktune::train
