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
// written, freed), so a save holds one projection beyond the model; the moments and the trainable
// values come as streams in any order (StreamedTensors), each written at its place
// (io::SafetensorsWriter), so that rank 0 of a distributed run need not hold them.
// It deliberately knows nothing of the training loop: the recipe hands it what to write.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/adapters/frozen_nf4_adapter.h"
#include "model/adapters/lora_adapter.h"
#include "model/decoder.h"

namespace ktune::train {

struct CheckpointerConfig;

struct AdapterDescription {
  model::LoraOptions options;
  std::vector<std::string> target_modules;  // HF module suffixes (q_proj, o_proj, gate_proj, …)
};

// Tensors a save writes as they come: `tensors` plans them (names, the dtypes written, shapes: the
// file's header, in this order), and stream() hands each to the sink once, in any order (f32 or the
// planned dtype: the checkpointer converts), each written at its place (io::SafetensorsWriter). So
// a save holds one tensor at a time whoever makes them: the host (host_trainable_values,
// streamed_as_they_are), or the ranks gathering them unit by unit as rank 0 writes them (a GPU
// run's moments and trained values, a CPU sharded full fine-tune's), where rank 0 would otherwise
// hold the whole model and its moments (16 bytes a parameter in f32).
struct StreamedTensors {
  std::vector<io::TensorSpec> tensors;
  std::function<void(const io::TensorSink&)> stream;
};
// Frozen values that are held in turn, not all at once (a sharded LoRA run's base: each unit's
// gathered in turn, rank 0 holding one at a time): their names, dtypes and shapes, and `hold`, which
// holds them a group at a time (every rank gathering with it) and calls `held` with the names of
// those it holds for that call.
struct FrozenInTurn {
  std::vector<io::TensorSpec> tensors;
  std::function<void(const std::function<void(const std::vector<std::string>& names)>& held)> hold;
};
// The parameters as a save plans them: names, the dtypes the model stores them in, shapes (each value
// must be defined: an Error naming it otherwise).
std::vector<io::TensorSpec> parameter_specs(const std::vector<model::Parameter*>& params);
// The parameters' host values as the model stores them (parameter_specs, then each value).
StreamedTensors host_trainable_values(const std::vector<model::Parameter*>& params);
// Tensors already made, as they are, in the map's order.
StreamedTensors streamed_as_they_are(const std::map<std::string, Tensor>& tensors);
// Planned tensors, planned and produced in their order (a GPU run's moments, whose gathers run in it).
StreamedTensors streamed_in_order(std::vector<io::PlannedTensor> planned);

struct SaveRequest {
  std::string name;                              // "epoch_0", "step_40"
  model::Decoder* decoder = nullptr;
  std::vector<std::shared_ptr<model::LoraAdapter>> adapters;  // empty: full fine-tune
  // QLoRA's layer projections without LoRA: the merged model holds their dequantised NF4 (torchtune's)
  std::vector<std::shared_ptr<model::FrozenNf4Adapter>> frozen_nf4;
  std::optional<AdapterDescription> adapter;
  bool adapter_weights_only = false;             // save_adapter_weights_only: no merged model
  DType weights_dtype = DType::BF16;             // of the merged model files
  nlohmann::json recipe_state;                   // epoch, step, loader position, ...
  // The AdamW moments as the optimizer keeps them (f32 or bf16): optimizer.safetensors, streamed
  // first of the checkpoint's files.
  StreamedTensors optimizer_state;
  // Saved in their own dtype for an exact resume, and streamed after optimizer.safetensors is
  // written and the merged model's other tensors are (the ranks' gathers: the moments', then the
  // values'). The decoder's parameters named here are not read from the host model.
  StreamedTensors trainable;
  // Where the model's frozen values are not all held (hold set): the merged model's tensors of the
  // parameters named here are made (merged with their adapters, which `adapters` hold whole) as
  // their values are held, after the other tensors of the model files are written. Not called for
  // an adapter_weights_only save.
  FrozenInTurn frozen;
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

// What one save writes, in bytes (tensor data; the copied non-weight files in `other`).
struct CheckpointBytes {
  int64_t model = 0;         // the merged model's files (none under save_adapter_weights_only)
  int64_t adapter = 0;       // adapter_model.safetensors
  int64_t recipe_state = 0;  // the trainable values and AdamW's two moments
  int64_t other = 0;         // config, tokenizer and the input's other non-weight files
  int64_t total() const { return model + adapter + recipe_state + other; }
};

class HfCheckpointer {
 public:
  HfCheckpointer(std::string checkpoint_dir, std::vector<std::string> checkpoint_files, std::string output_dir);

  // torchtune 0.6.1 reads a full fine-tune's checkpoint_files from output_dir when it resumes (its
  // resume instructions name them epoch_N/model-....safetensors): with this set, a listed file found
  // there instead of in checkpoint_dir is accepted. ktune resumes from the newest recipe state either way.
  void accept_files_under_output_dir(bool accept) { files_under_output_dir_ = accept; }

  // The base model, its weights stored in `storage` (f32, or bf16 for pure-bf16 training). Errors
  // name a listed checkpoint file that does not exist.
  // map_values: model::LoadOptions::map_values (values the run only reads, then releases).
  std::unique_ptr<model::Decoder> load_model(DType storage = DType::F32, bool map_values = false) const;
  // Writes output_dir/<request.name>/ atomically; returns its path. A save that fails (a full disk,
  // a stream that throws) removes what it had written and leaves any older checkpoint of that name.
  std::string save(const SaveRequest& request) const;
  // The checkpoint under output_dir a resume continues from: of those that hold a recipe state, the
  // one saved last (the state's saved_at, unix seconds, which a copy of the folder keeps; a state
  // without one, from before it was recorded, counts as older; then the higher global step), so that
  // a run started afresh in a folder an earlier, longer run left checkpoints in resumes from its own
  // last save, not from the earlier run's larger step. None when there is no such checkpoint.
  std::optional<std::string> find_latest() const;
  // What one save will write, planned before the run trains: the input checkpoint's tensors in
  // weights_dtype (the merged model holds the same tensors), the trainable values (`trainable`, as
  // a save plans them) and two moments of each in its dtype, a LoRA run's adapter file, and the
  // non-weight files a save copies.
  CheckpointBytes planned_bytes(const std::vector<io::TensorSpec>& trainable, DType weights_dtype, bool lora,
                                bool adapter_weights_only) const;
  // Bytes free to this process on output_dir's filesystem (its nearest existing ancestor's), if the
  // filesystem says.
  std::optional<int64_t> free_bytes() const;
  // What saves killed midway left under output_dir, put right: a save writes .NAME.tmp-PID, moves an
  // older NAME aside to .NAME.old-PID, renames the temporary into place and removes the older one.
  // Killed between the two renames, NAME is missing: the temporary (complete once the older one was
  // moved aside) becomes NAME, or without it the older one goes back. Any other leftover (a partial
  // temporary, an older copy whose NAME is in place) is removed. What a process that still runs on
  // this machine left (another run saving into the same output_dir) is left alone. Rank 0 calls this
  // before any rank looks for a checkpoint. Returns a line per change.
  std::vector<std::string> recover_interrupted_saves() const;
  ResumePoint load_resume_point(const std::string& dir) const;
  // Refuses, before training, a damaged JSON file among those a save copies (copied_files_check.h).
  void check_copied_files() const;

  // What an adapter's adapter_config.json names as its base (base_model_name_or_path): the Hub repo
  // id the model was downloaded from (checkpoint_dir's original_repo_id.json, written by `ktune
  // download`, the model initializer and torchtune's `tune download`), else checkpoint_dir's
  // absolute path. A malformed original_repo_id.json is an Error naming it. Read by
  // check_copied_files (before training) and kept; read at each call before that.
  std::string base_model_name() const;

  const std::string& checkpoint_dir() const { return checkpoint_dir_; }
  const std::string& output_dir() const { return output_dir_; }

 private:
  // Everything a save writes, into the fresh directory `into` (save renames it into place).
  void write_checkpoint(const SaveRequest& request, const std::filesystem::path& into) const;

  std::string read_base_model_name() const;

  std::string checkpoint_dir_;
  mutable std::optional<std::string> base_model_name_;  // check_copied_files' reading
  std::vector<std::string> checkpoint_files_;
  bool files_under_output_dir_ = false;
  std::string output_dir_;
};

// PEFT's adapter_config.json for the adapters.
nlohmann::json peft_adapter_config(const AdapterDescription& adapter, const std::string& base_model);

}  // namespace ktune::train
