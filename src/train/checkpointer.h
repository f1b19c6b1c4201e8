// torchtune's FullModelHFCheckpointer, natively: loads the base model from an HF checkpoint
// directory and writes checkpoints in torchtune's output layout, each written whole into a
// temporary directory and renamed into place, so a crash never leaves a half checkpoint as the
// latest:
//   output_dir/epoch_N/ (or step_N/)
//     model-0000k-of-0000n.safetensors + model.safetensors.index.json   the full (merged) model,
//                                          sharded as the input checkpoint was, in the run's dtype
//     config.json, tokenizer and other non-weight files copied from the checkpoint directory
//     adapter_model.safetensors + adapter_config.json                  LoRA: PEFT's format
//     recipe_state/recipe_state.json, optimizer.safetensors, trainable.safetensors
//                                          what resume needs, in the dtype training keeps it in
//                                          (f32, or bf16 for a pure-bf16 run), so that it continues exactly
// The merged model is made as it is written, one tensor at a time (each merged projection made,
// written, freed), so a save holds one projection beyond the model; the trainable values come as a
// stream in any order (TrainableValues), each written at its place (io::SafetensorsWriter), so a
// GPU run's host need not hold them.
// It deliberately knows nothing of the training loop: the recipe hands it what to write.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"

namespace ktune::train {

struct CheckpointerConfig;

struct AdapterDescription {
  model::LoraOptions options;
  std::vector<std::string> target_modules;  // HF module suffixes (q_proj, o_proj, gate_proj, …)
};

// The trainable values a save writes: recipe_state/trainable.safetensors, each in the dtype training
// keeps it in (`tensors`), and, of a full fine-tune, the model files. stream() hands each of
// `tensors` to the sink once, in any order (f32 or its own dtype: the checkpointer converts): the
// host values (host_trainable_values), or a GPU run's downloaded unit by unit as they are written, so
// that no host holds them all (a full fine-tune's rank 0 keeps no values: 16 GB at 8B in bf16).
struct TrainableValues {
  std::vector<io::TensorSpec> tensors;
  std::function<void(const io::TensorSink&)> stream;
};
// The parameters' host values as they are (each must be defined: an Error naming it otherwise).
TrainableValues host_trainable_values(const std::vector<model::Parameter*>& params);

struct SaveRequest {
  std::string name;                              // "epoch_0", "step_40"
  model::Decoder* decoder = nullptr;
  std::vector<std::shared_ptr<model::LoraAdapter>> adapters;  // empty: full fine-tune
  std::optional<AdapterDescription> adapter;
  bool adapter_weights_only = false;             // save_adapter_weights_only: no merged model
  DType weights_dtype = DType::BF16;             // of the merged model files
  nlohmann::json recipe_state;                   // epoch, step, loader position, ...
  // as the optimizer keeps them (f32 or bf16), each produced as optimizer.safetensors is written
  // (a GPU run's: gathered from the GPUs then), in this order; written before the model files
  std::vector<io::PlannedTensor> optimizer_state;
  // Saved in their own dtype for an exact resume, and streamed after optimizer.safetensors is
  // written and the merged model's other tensors are (a GPU run's gathers: the moments', then the
  // weights'). The decoder's parameters named here are not read from the host model.
  TrainableValues trainable;
};

// What resume reads. The tensors are views of the recipe-state files' read-only mappings (they keep
// the files mapped while they live; a consumer copies out the part it needs and never writes into
// them), so that no rank holds a whole copy of the moments and weights: at 8B, a full fine-tune's
// recipe state is 64 GB or more, copied whole on every rank otherwise.
struct ResumePoint {
  std::string dir;              // the checkpoint directory
  nlohmann::json recipe_state;
  std::map<std::string, Tensor> optimizer_state;  // in the dtype saved (f32 or bf16; another: f32)
  std::map<std::string, Tensor> trainable;  // by parameter name, in the dtype saved
};

class HfCheckpointer {
 public:
  HfCheckpointer(std::string checkpoint_dir, std::vector<std::string> checkpoint_files, std::string output_dir);

  // The base model, its weights stored in `storage` (f32, or bf16 for pure-bf16 training). Errors
  // name a listed checkpoint file that does not exist.
  // map_values: model::LoadOptions::map_values (values the run only reads, then releases).
  std::unique_ptr<model::Decoder> load_model(DType storage = DType::F32, bool map_values = false) const;
  // Writes output_dir/<request.name>/ atomically; returns its path.
  std::string save(const SaveRequest& request) const;
  // The newest checkpoint under output_dir that holds a recipe state (by global step), if any.
  std::optional<std::string> find_latest() const;
  ResumePoint load_resume_point(const std::string& dir) const;

  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  const std::string& output_dir() const { return output_dir_; }

 private:
  std::string checkpoint_dir_;
  std::vector<std::string> checkpoint_files_;
  std::string output_dir_;
};

// PEFT's adapter_config.json for the adapters.
nlohmann::json peft_adapter_config(const AdapterDescription& adapter, const std::string& base_model);

}  // namespace ktune::train
