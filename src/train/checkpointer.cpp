#include "train/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace ktune::train {

namespace {

bool is_weight_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::string name = p.filename().string();
  return ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
         name == "model.safetensors.index.json" || name == "pytorch_model.bin.index.json";
}

// Copies the non-weight files (config, tokenizer, generation config, original/tokenizer.model, ...).
void copy_non_weight_files(const fs::path& from, const fs::path& to) {
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(from)) {
    if (!e.is_regular_file() || is_weight_file(e.path())) continue;
    fs::path rel = fs::relative(e.path(), from);
    if (rel.begin()->string().rfind("epoch_", 0) == 0 || rel.begin()->string().rfind("step_", 0) == 0) continue;
    fs::create_directories((to / rel).parent_path());
    fs::copy_file(e.path(), to / rel, fs::copy_options::overwrite_existing);
  }
}

std::string shard_name(size_t index, size_t count) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", index + 1, count);
  return name;
}

Tensor in_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// The model as HF names it, in order, each tensor made only when the writer reaches it (so that a save
// holds one merged projection at a time, not the merged model): a projection whose adapter is among
// `adapters` merged with it (a bf16-stored base, pure-bf16 LoRA: into an f32 copy of it; QLoRA's from
// its NF4 base), any other parameter as it is; in `dtype`. Tied heads are not parameters: not written.
std::vector<io::PlannedTensor> merged_model_tensors(model::Decoder& decoder,
                                                    const std::vector<std::shared_ptr<model::LoraAdapter>>& adapters,
                                                    DType dtype) {
  std::map<std::string, std::pair<const model::Linear*, const model::LoraAdapter*>> adapted;  // by weight name
  for (model::Linear* linear : decoder.linears())
    for (const auto& a : adapters)
      if (linear->adapter && a.get() == linear->adapter.get()) adapted[linear->weight->name] = {linear, a.get()};
  std::vector<io::PlannedTensor> tensors;
  for (model::Parameter* p : decoder.parameters()) {
    if (p->name.rfind("base_model.model.", 0) == 0) continue;  // adapter parameters
    auto it = adapted.find(p->name);
    if (it == adapted.end()) {
      check(p->value.defined(), "checkpointer", "cannot save " + p->name + ": its value was released");
      tensors.push_back({p->name, dtype, p->value.shape(), [p, dtype] { return in_dtype(p->value, dtype); }});
      continue;
    }
    const auto [linear, adapter] = it->second;
    tensors.push_back({p->name, dtype, Shape{linear->out, linear->in}, [linear, adapter, dtype] {
                         if (!linear->weight->value.defined() || linear->weight->value.dtype() == DType::F32)
                           return in_dtype(adapter->merged_weight(*linear), dtype);
                         model::Parameter widened{linear->weight->name, linear->weight->value.to(DType::F32), Tensor(), false};
                         model::Linear copy = *linear;
                         copy.weight = &widened;
                         return in_dtype(adapter->merged_weight(copy), dtype);
                       }});
  }
  return tensors;
}

void write_json(const fs::path& path, const nlohmann::json& j) { io::write_file_atomic(path.string(), j.dump(2) + "\n"); }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string(), "cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path.string(), std::string("malformed JSON: ") + e.what());
  }
}

// Every tensor of a recipe-state file in the dtype it was saved in (f32 or bf16: what training
// keeps) as a view of the file's read-only mapping (another dtype: an f32 copy). Nothing is read
// until a consumer copies out what it needs, so a rank of a sharded run faults in only its own
// pieces, and the ranks of one machine share the pages through the page cache.
std::map<std::string, Tensor> map_all(const fs::path& path) {
  std::map<std::string, Tensor> out;
  io::SafetensorsFile file = io::SafetensorsFile::open(path.string());
  for (const std::string& name : file.names()) {
    Tensor t = file.view(name);
    out[name] = t.dtype() == DType::F32 || t.dtype() == DType::BF16 ? t : file.to_f32(name);
  }
  return out;
}

}  // namespace

nlohmann::json peft_adapter_config(const AdapterDescription& adapter, const std::string& base_model) {
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base_model},
          {"r", adapter.options.rank},
          {"lora_alpha", adapter.options.alpha},
          {"lora_dropout", adapter.options.dropout},
          {"target_modules", adapter.target_modules},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"modules_to_save", nullptr},
          {"use_rslora", adapter.options.use_rslora},
          {"use_dora", adapter.options.use_dora}};
}

HfCheckpointer::HfCheckpointer(std::string checkpoint_dir, std::vector<std::string> checkpoint_files, std::string output_dir)
    : checkpoint_dir_(std::move(checkpoint_dir)), checkpoint_files_(std::move(checkpoint_files)), output_dir_(std::move(output_dir)) {}

std::unique_ptr<model::Decoder> HfCheckpointer::load_model(DType storage, bool map_values) const {
  if (!fs::is_directory(checkpoint_dir_))
    throw Error("checkpointer.checkpoint_dir", "'" + checkpoint_dir_ + "' is not a directory");
  for (const std::string& f : checkpoint_files_)
    if (!fs::exists(fs::path(checkpoint_dir_) / f))
      throw Error("checkpointer.checkpoint_files", "'" + f + "' does not exist in " + checkpoint_dir_);
  model::LoadOptions options;
  options.storage = storage;
  options.map_values = map_values;
  return model::Decoder::from_pretrained(checkpoint_dir_, options);
}

std::string HfCheckpointer::save(const SaveRequest& request) const {
  check(request.decoder != nullptr, "checkpointer", "nothing to save");
  const fs::path final_dir = fs::path(output_dir_) / request.name;
  const fs::path tmp = fs::path(output_dir_) / ("." + request.name + ".tmp-" + std::to_string(getpid()));
  fs::remove_all(tmp);
  fs::create_directories(tmp / "recipe_state");
  copy_non_weight_files(checkpoint_dir_, tmp);

  // What resume needs, in the dtypes training keeps (f32, or bf16 in a pure-bf16 run). First: a GPU
  // run's moments are gathered by all GPUs as they are written, so the other ranks wait for no more
  // than this file.
  write_json(tmp / "recipe_state" / "recipe_state.json", request.recipe_state);
  io::write_safetensors_streamed((tmp / "recipe_state" / "optimizer.safetensors").string(), request.optimizer_state);
  std::vector<io::NamedTensor> trainable;
  for (model::Parameter* p : request.trainable) trainable.push_back({p->name, p->value});
  io::write_safetensors((tmp / "recipe_state" / "trainable.safetensors").string(), trainable);

  const bool lora = !request.adapters.empty();
  if (!(lora && request.adapter_weights_only)) {
    // The merged model, sharded as the input checkpoint was (torchtune's naming and index).
    std::vector<io::PlannedTensor> tensors = merged_model_tensors(*request.decoder, request.adapters, request.weights_dtype);
    io::SafetensorsCheckpoint input = io::SafetensorsCheckpoint::open(checkpoint_dir_);
    std::vector<std::string> input_files;
    for (const io::PlannedTensor& t : tensors) {
      std::string file = input.contains(t.name) ? input.file_of(t.name).path() : "";
      if (std::find(input_files.begin(), input_files.end(), file) == input_files.end()) input_files.push_back(file);
    }
    std::vector<std::vector<io::PlannedTensor>> shards(input_files.size());
    nlohmann::json weight_map = nlohmann::json::object();
    uint64_t total = 0;
    for (const io::PlannedTensor& t : tensors) {
      std::string file = input.contains(t.name) ? input.file_of(t.name).path() : "";
      size_t index = size_t(std::find(input_files.begin(), input_files.end(), file) - input_files.begin());
      shards[index].push_back(t);
      weight_map[t.name] = shard_name(index, shards.size());
      total += dtype_bytes(t.dtype, size_t(t.shape.numel()));
    }
    for (size_t i = 0; i < shards.size(); ++i)
      io::write_safetensors_streamed((tmp / shard_name(i, shards.size())).string(), shards[i], {{"format", "pt"}});
    write_json(tmp / "model.safetensors.index.json", {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});
  }
  if (lora) {
    std::vector<io::NamedTensor> adapter_tensors;
    for (const auto& a : request.adapters)
      for (model::Parameter* p : a->parameters()) adapter_tensors.push_back({p->name, p->value});
    io::write_safetensors((tmp / "adapter_model.safetensors").string(), adapter_tensors, {{"format", "pt"}});
    check(request.adapter.has_value(), "checkpointer", "LoRA checkpoint without an adapter description");
    write_json(tmp / "adapter_config.json", peft_adapter_config(*request.adapter, fs::absolute(checkpoint_dir_).string()));
  }

  // Into place: an older checkpoint of the same name is moved aside first, then removed.
  if (fs::exists(final_dir)) {
    fs::path old = fs::path(output_dir_) / ("." + request.name + ".old-" + std::to_string(getpid()));
    fs::remove_all(old);
    fs::rename(final_dir, old);
    fs::rename(tmp, final_dir);
    fs::remove_all(old);
  } else {
    fs::rename(tmp, final_dir);
  }
  return final_dir.string();
}

std::optional<std::string> HfCheckpointer::find_latest() const {
  if (!fs::is_directory(output_dir_)) return std::nullopt;
  std::optional<std::string> best;
  int64_t best_step = -1;
  for (const fs::directory_entry& e : fs::directory_iterator(output_dir_)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.empty() || name[0] == '.') continue;
    fs::path state = e.path() / "recipe_state" / "recipe_state.json";
    if (!fs::exists(state)) continue;
    int64_t step = read_json(state).value("global_step", int64_t(-1));
    if (step > best_step) {
      best_step = step;
      best = e.path().string();
    }
  }
  return best;
}

ResumePoint HfCheckpointer::load_resume_point(const std::string& dir) const {
  ResumePoint point;
  point.dir = dir;
  fs::path state_dir = fs::path(dir) / "recipe_state";
  point.recipe_state = read_json(state_dir / "recipe_state.json");
  point.optimizer_state = map_all(state_dir / "optimizer.safetensors");
  point.trainable = map_all(state_dir / "trainable.safetensors");
  return point;
}

}  // namespace ktune::train
