#include "train/checkpointer.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <utility>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/free_space.h"
#include "core/log.h"
#include "core/process_identity.h"
#include "io/safetensors.h"
#include "train/copied_files_check.h"

namespace fs = std::filesystem;

namespace ktune::train {

namespace {

bool is_weight_file(const fs::path& p) {
  std::string ext = p.extension().string();
  std::string name = p.filename().string();
  return ext == ".safetensors" || ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf" ||
         name == "model.safetensors.index.json" || name == "pytorch_model.bin.index.json";
}

// Whether a path relative to the checkpoint folder is hidden: a dot-file, or anything under a dot
// folder (huggingface_hub's .cache/ of a local_dir download, .git/), which torchtune skips too.
bool is_hidden(const fs::path& rel) {
  for (const fs::path& part : rel)
    if (part.string().size() > 1 && part.string()[0] == '.' && part != "..") return true;
  return false;
}

// The non-weight files a save copies (config, tokenizer, generation config, original/tokenizer.model,
// ...), relative to `from`. Not a checkpoint's own epoch_N / step_N, hidden files, nor an adapter's
// config (a model trained from an earlier LoRA output must not carry that run's stale adapter_config.json,
// which transformers would apply over the new weights; a LoRA save writes its own).
std::vector<fs::path> non_weight_files(const fs::path& from) {
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(from)) {
    if (!e.is_regular_file() || is_weight_file(e.path()) || e.path().filename() == "adapter_config.json") continue;
    fs::path rel = fs::relative(e.path(), from);
    if (rel.begin()->string().rfind("epoch_", 0) == 0 || rel.begin()->string().rfind("step_", 0) == 0) continue;
    if (is_hidden(rel)) continue;
    files.push_back(rel);
  }
  return files;
}

void copy_non_weight_files(const fs::path& from, const fs::path& to) {
  for (const fs::path& rel : non_weight_files(from)) {
    fs::create_directories((to / rel).parent_path());
    // Read and written by us rather than fs::copy_file, whose failed write says only "Input/output
    // error": a full disk is then named as such, with the file.
    std::ifstream in(from / rel, std::ios::binary);
    std::string bytes(std::istreambuf_iterator<char>(in), {});
    if (!in.good() && !in.eof()) throw Error((from / rel).string(), "cannot read");
    write_file_atomic((to / rel).string(), bytes);
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
// `adapters` merged with it (LoraAdapter::merged_weight: a bf16-stored base widened into an f32 copy;
// QLoRA's from its NF4 base), one among `frozen_nf4` its dequantised NF4, any other parameter as it
// is; in `dtype`. A parameter among `streamed` (the trainable
// values a save streams, StreamedTensors) is planned with that shape and no produce(): its values come
// from the stream. One among `in_turn` (FrozenInTurn) is planned with that shape, its value read only
// when produce() runs. Tied heads are not parameters: not written.
std::vector<io::PlannedTensor> merged_model_tensors(model::Decoder& decoder,
                                                    const std::vector<std::shared_ptr<model::LoraAdapter>>& adapters,
                                                    const std::vector<std::shared_ptr<model::FrozenNf4Adapter>>& frozen_nf4,
                                                    DType dtype, const std::map<std::string, Shape>& streamed,
                                                    const std::map<std::string, Shape>& in_turn) {
  // By weight name: the projection, and the weight a plain Linear would need in its place.
  std::map<std::string, std::pair<const model::Linear*, std::function<Tensor()>>> adapted;
  for (model::Linear* linear : decoder.linears()) {
    if (!linear->adapter) continue;
    for (const auto& a : adapters)
      if (a.get() == linear->adapter.get())
        adapted[linear->weight->name] = {linear, [linear, a] { return a->merged_weight(*linear); }};
    for (const auto& f : frozen_nf4)
      if (f.get() == linear->adapter.get())
        adapted[linear->weight->name] = {linear, [linear, f] { return f->merged_weight(*linear); }};
  }
  std::vector<io::PlannedTensor> tensors;
  for (model::Parameter* p : decoder.parameters()) {
    if (p->name.rfind("base_model.model.", 0) == 0) continue;  // adapter parameters
    if (auto s = streamed.find(p->name); s != streamed.end()) {
      tensors.push_back({p->name, dtype, s->second, nullptr});
      continue;
    }
    auto it = adapted.find(p->name);
    if (it == adapted.end()) {
      auto later = in_turn.find(p->name);
      check(later != in_turn.end() || p->value.defined(), "checkpointer", "cannot save " + p->name + ": its value was released");
      tensors.push_back({p->name, dtype, later != in_turn.end() ? later->second : p->value.shape(), [p, dtype] {
                           check(p->value.defined(), "checkpointer", "cannot save " + p->name + ": its value is not held");
                           return in_dtype(model::stored_value(*p), dtype);
                         }});
      continue;
    }
    const auto& [linear, merged] = it->second;
    tensors.push_back({p->name, dtype, Shape{linear->out, linear->in},
                       [merged, dtype] { return in_dtype(merged(), dtype); }});
  }
  return tensors;
}

// The merged model's files, sharded as the input checkpoint was (torchtune's naming and index),
// opened by position with every tensor planned, and filled with every tensor but the streamed ones
// (no produce()), which the save's stream writes; index: model.safetensors.index.json's content.
struct ModelFiles {
  std::vector<std::unique_ptr<io::SafetensorsWriter>> shards;
  nlohmann::json index;
  io::SafetensorsWriter* file_of(const std::string& name) const {
    for (const auto& shard : shards)
      if (shard->holds(name)) return shard.get();
    return nullptr;
  }
};

ModelFiles open_model_files(const fs::path& dir, const std::string& checkpoint_dir,
                            const std::vector<io::PlannedTensor>& tensors) {
  io::SafetensorsCheckpoint input = io::SafetensorsCheckpoint::open(checkpoint_dir);
  // Each tensor's input file; the output's shard k is the input's k-th file by name (its
  // model-0000k-of-0000n, as torchtune numbers them), tensors the input lacks in a last one.
  std::vector<std::string> file_of_tensor;
  for (const io::PlannedTensor& t : tensors)
    file_of_tensor.push_back(input.contains(t.name) ? fs::path(input.file_of(t.name).path()).filename().string() : "");
  std::vector<std::string> input_files = file_of_tensor;
  std::sort(input_files.begin(), input_files.end(), [](const std::string& a, const std::string& b) {
    return a.empty() != b.empty() ? b.empty() : a < b;
  });
  input_files.erase(std::unique(input_files.begin(), input_files.end()), input_files.end());
  std::vector<std::vector<io::TensorSpec>> specs(input_files.size());
  std::vector<size_t> shard_of;  // by tensor
  for (size_t i = 0; i < tensors.size(); ++i) {
    shard_of.push_back(size_t(std::find(input_files.begin(), input_files.end(), file_of_tensor[i]) - input_files.begin()));
    specs[shard_of.back()].push_back({tensors[i].name, tensors[i].dtype, tensors[i].shape});
  }
  ModelFiles files;
  nlohmann::json weight_map = nlohmann::json::object();
  uint64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    weight_map[tensors[i].name] = shard_name(shard_of[i], specs.size());
    total += dtype_bytes(tensors[i].dtype, size_t(tensors[i].shape.numel()));
  }
  for (size_t s = 0; s < specs.size(); ++s)
    files.shards.push_back(std::make_unique<io::SafetensorsWriter>((dir / shard_name(s, specs.size())).string(),
                                                                   specs[s], std::map<std::string, std::string>{{"format", "pt"}}));
  for (size_t i = 0; i < tensors.size(); ++i)  // one made, written and dropped at a time
    if (tensors[i].produce) files.shards[shard_of[i]]->write(tensors[i].name, tensors[i].produce());
  files.index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  return files;
}

// The streamed tensors into one file at path, each in its planned dtype.
void write_streamed(const std::string& path, const StreamedTensors& tensors) {
  io::SafetensorsWriter file(path, tensors.tensors);
  if (tensors.stream)
    tensors.stream([&](const std::string& name, const Tensor& t) { file.write(name, in_dtype(t, file.spec(name).dtype)); });
  file.commit();
}

void write_json(const fs::path& path, const nlohmann::json& j) { write_file_atomic(path.string(), j.dump(2) + "\n"); }

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw Error(path.string(), "cannot read");
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path.string(), std::string("malformed JSON: ") + e.what());
  }
}

// config.json as a merged model's save writes it: the input's, saying the dtype the merged files
// hold (torch_dtype, and transformers 5's dtype where the config has it), so that a load with
// dtype="auto" keeps a bf16 model in bf16 (torchtune copies the input's config unchanged: a bf16
// run's outputs then claim float32). Empty when there is no config.json or it is not an object.
std::string config_as_saved(const fs::path& config, DType weights) {
  if (!fs::is_regular_file(config)) return "";
  nlohmann::json j = read_json(config);
  if (!j.is_object()) return "";
  const char* name = weights == DType::BF16 ? "bfloat16" : weights == DType::F16 ? "float16" : "float32";
  j["torch_dtype"] = name;
  if (j.contains("dtype")) j["dtype"] = name;
  return j.dump(2) + "\n";
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

std::vector<io::TensorSpec> parameter_specs(const std::vector<model::Parameter*>& params) {
  std::vector<io::TensorSpec> specs;
  for (const model::Parameter* p : params) {
    check(p->value.defined(), "checkpointer", "cannot save " + p->name + ": its value was released");
    specs.push_back({p->name, model::stored_dtype_of(*p), p->value.shape()});
  }
  return specs;
}

StreamedTensors host_trainable_values(const std::vector<model::Parameter*>& params) {
  StreamedTensors values;
  values.tensors = parameter_specs(params);
  values.stream = [params](const io::TensorSink& sink) {
    for (const model::Parameter* p : params) sink(p->name, model::stored_value(*p));
  };
  return values;
}

StreamedTensors streamed_as_they_are(const std::map<std::string, Tensor>& tensors) {
  StreamedTensors streamed;
  for (const auto& [name, t] : tensors) streamed.tensors.push_back({name, t.dtype(), t.shape()});
  streamed.stream = [tensors](const io::TensorSink& sink) {  // shares the tensors' storage
    for (const auto& [name, t] : tensors) sink(name, t);
  };
  return streamed;
}

StreamedTensors streamed_in_order(std::vector<io::PlannedTensor> planned) {
  StreamedTensors streamed;
  for (const io::PlannedTensor& t : planned) streamed.tensors.push_back({t.name, t.dtype, t.shape});
  streamed.stream = [planned = std::move(planned)](const io::TensorSink& sink) {
    for (const io::PlannedTensor& t : planned) sink(t.name, t.produce());  // each dropped before the next is made
  };
  return streamed;
}

// A float option as the decimal it was written as (0.05f as 0.05, not 0.05000000074505806): the
// shortest text that reads back as the same float.
static double as_written(float value) {
  char text[32];
  const std::to_chars_result r = std::to_chars(text, text + sizeof text, value);
  return std::strtod(std::string(text, r.ptr).c_str(), nullptr);
}

nlohmann::json peft_adapter_config(const AdapterDescription& adapter, const std::string& base_model) {
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base_model},
          {"r", adapter.options.rank},
          {"lora_alpha", as_written(adapter.options.alpha)},
          {"lora_dropout", as_written(adapter.options.dropout)},
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
    if (!fs::exists(fs::path(checkpoint_dir_) / f) && !(files_under_output_dir_ && fs::exists(fs::path(output_dir_) / f)))
      throw Error("checkpointer.checkpoint_files",
                  "'" + f + "' does not exist in " + checkpoint_dir_ +
                      (files_under_output_dir_ ? " nor (torchtune's resume) in " + output_dir_ : std::string()));
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
  try {
    write_checkpoint(request, tmp);
  } catch (...) {
    // A failed save (often a full disk) must not leave a model-sized partial copy behind.
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    throw;
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

void HfCheckpointer::write_checkpoint(const SaveRequest& request, const fs::path& tmp) const {
  fs::create_directories(tmp / "recipe_state");
  copy_non_weight_files(checkpoint_dir_, tmp);

  // What resume needs, in the dtypes training keeps (f32, or bf16 in a pure-bf16 run). First: a GPU
  // run's moments are gathered by all GPUs as they are written, so the other ranks wait for no more
  // than this file.
  write_json(tmp / "recipe_state" / "recipe_state.json", request.recipe_state);
  write_streamed((tmp / "recipe_state" / "optimizer.safetensors").string(), request.optimizer_state);
  io::SafetensorsWriter trainable((tmp / "recipe_state" / "trainable.safetensors").string(), request.trainable.tensors);

  const bool lora = !request.adapters.empty();
  ModelFiles model_files;
  std::map<std::string, std::function<Tensor()>> in_turn;  // made as FrozenInTurn holds their values
  if (!(lora && request.adapter_weights_only)) {
    std::map<std::string, Shape> streamed, frozen;
    for (const io::TensorSpec& t : request.trainable.tensors) streamed[t.name] = t.shape;
    if (request.frozen.hold)
      for (const io::TensorSpec& t : request.frozen.tensors) frozen[t.name] = t.shape;
    std::vector<io::PlannedTensor> tensors =
        merged_model_tensors(*request.decoder, request.adapters, request.frozen_nf4,
                             request.weights_dtype, streamed, frozen);
    for (io::PlannedTensor& t : tensors)
      if (frozen.count(t.name)) in_turn[t.name] = std::exchange(t.produce, nullptr);  // not written at the opening
    model_files = open_model_files(tmp, checkpoint_dir_, tensors);
    if (const std::string config = config_as_saved(fs::path(checkpoint_dir_) / "config.json", request.weights_dtype);
        !config.empty())
      write_file_atomic((tmp / "config.json").string(), config);
  }
  if (!in_turn.empty()) {
    request.frozen.hold([&](const std::vector<std::string>& names) {
      for (const std::string& name : names) {
        auto it = in_turn.find(name);
        check(it != in_turn.end(), "checkpointer", "frozen value " + name + " held twice, or not planned");
        model_files.file_of(name)->write(name, it->second());
        in_turn.erase(it);
      }
    });
    if (!in_turn.empty())
      throw Error("checkpointer", "the merged model's " + in_turn.begin()->first + " was never held to be written");
  }
  // The trainable values, each into its places as it comes (in the dtype each file holds).
  if (request.trainable.stream) request.trainable.stream([&](const std::string& name, const Tensor& value) {
    trainable.write(name, in_dtype(value, trainable.spec(name).dtype));
    if (io::SafetensorsWriter* file = model_files.file_of(name)) file->write(name, in_dtype(value, request.weights_dtype));
  });
  trainable.commit();
  for (const auto& shard : model_files.shards) shard->commit();
  if (!model_files.shards.empty()) write_json(tmp / "model.safetensors.index.json", model_files.index);
  if (lora) {
    std::vector<io::NamedTensor> adapter_tensors;
    for (const auto& a : request.adapters)
      for (model::Parameter* p : a->parameters()) adapter_tensors.push_back({p->name, p->value});
    io::write_safetensors((tmp / "adapter_model.safetensors").string(), adapter_tensors, {{"format", "pt"}});
    check(request.adapter.has_value(), "checkpointer", "LoRA checkpoint without an adapter description");
    write_json(tmp / "adapter_config.json", peft_adapter_config(*request.adapter, base_model_name()));
  }
}

std::optional<std::string> HfCheckpointer::find_latest() const {
  if (!fs::is_directory(output_dir_)) return std::nullopt;
  std::optional<std::string> best;
  std::pair<double, int64_t> best_key{-1, -1};  // saved_at, global step
  for (const fs::directory_entry& e : fs::directory_iterator(output_dir_)) {
    std::string name = e.path().filename().string();
    if (!e.is_directory() || name.empty() || name[0] == '.') continue;
    fs::path state = e.path() / "recipe_state" / "recipe_state.json";
    if (!fs::exists(state)) continue;
    const nlohmann::json recipe_state = read_json(state);
    const std::pair<double, int64_t> key{recipe_state.value("saved_at", 0.0), recipe_state.value("global_step", int64_t(-1))};
    if (key > best_key) {
      best_key = key;
      best = e.path().string();
    }
  }
  return best;
}

CheckpointBytes HfCheckpointer::planned_bytes(const std::vector<io::TensorSpec>& trainable, DType weights_dtype,
                                              bool lora, bool adapter_weights_only) const {
  CheckpointBytes bytes;
  if (!(lora && adapter_weights_only)) {
    const io::SafetensorsCheckpoint input = io::SafetensorsCheckpoint::open(checkpoint_dir_);
    for (const std::string& name : input.names())
      bytes.model += int64_t(dtype_bytes(weights_dtype, size_t(input.info(name).shape.numel())));
  }
  for (const io::TensorSpec& t : trainable) {
    const int64_t value = int64_t(dtype_bytes(t.dtype, size_t(t.shape.numel())));
    bytes.recipe_state += 3 * value;  // the value, exp_avg and exp_avg_sq
    if (lora) bytes.adapter += value;
  }
  for (const fs::path& rel : non_weight_files(checkpoint_dir_))
    bytes.other += int64_t(fs::file_size(fs::path(checkpoint_dir_) / rel));
  const fs::path config = fs::path(checkpoint_dir_) / "config.json";
  if (const std::string saved = config_as_saved(config, weights_dtype); !saved.empty() && !(lora && adapter_weights_only))
    bytes.other += int64_t(saved.size()) - int64_t(fs::file_size(config));  // rewritten with the merged dtype
  return bytes;
}

std::optional<int64_t> HfCheckpointer::free_bytes() const {
  const std::optional<uint64_t> free = free_bytes_at(output_dir_);
  if (!free) return std::nullopt;
  return int64_t(*free);
}

namespace {

// A save's hidden leftover: .NAME.tmp-PID or .NAME.old-PID.
struct SaveLeftover {
  fs::path path;
  std::string checkpoint;  // NAME
  std::string kind;        // "tmp" or "old"
  std::string pid;
};

// Whether a live process of this id, other than this one, runs on this machine (a zombie does not).
bool process_is_running(const std::string& pid_text) {
  long pid = 0;
  try {
    pid = std::stol(pid_text);
  } catch (const std::exception&) {
    return false;
  }
  if (pid <= 0 || pid == long(getpid()) || pid > long(std::numeric_limits<int>::max())) return false;
  return process_is_alive(int(pid), /*start_time=*/0);
}

std::optional<SaveLeftover> save_leftover(const fs::path& path) {
  const std::string file = path.filename().string();
  static const std::regex pattern(R"(\.(.+)\.(tmp|old)-([0-9]+))");
  std::smatch m;
  if (!std::regex_match(file, m, pattern)) return std::nullopt;
  return SaveLeftover{path, m[1], m[2], m[3]};
}

}  // namespace

void HfCheckpointer::check_copied_files() const {
  if (!fs::is_directory(checkpoint_dir_)) return;  // load_model names a missing checkpoint_dir
  train::check_copied_files(checkpoint_dir_, non_weight_files(checkpoint_dir_));
  base_model_name_ = read_base_model_name();  // before training rather than at the first save, and once
}

std::string HfCheckpointer::base_model_name() const {
  return base_model_name_ ? *base_model_name_ : read_base_model_name();
}

std::string HfCheckpointer::read_base_model_name() const {
  const fs::path repo_id_file = fs::path(checkpoint_dir_) / "original_repo_id.json";
  if (!fs::exists(repo_id_file)) return fs::absolute(checkpoint_dir_).string();
  const nlohmann::json j = read_json(repo_id_file);
  if (!j.is_object() || !j.contains("repo_id") || !j["repo_id"].is_string() || j["repo_id"].get<std::string>().empty())
    throw Error(repo_id_file.string(), "expected {\"repo_id\": \"org/name\"} (the Hub repo the model was downloaded from)");
  return j["repo_id"].get<std::string>();
}

std::vector<std::string> HfCheckpointer::recover_interrupted_saves() const {
  std::vector<std::string> changes;
  if (!fs::is_directory(output_dir_)) return changes;
  std::vector<SaveLeftover> leftovers;
  for (const fs::directory_entry& e : fs::directory_iterator(output_dir_))
    if (e.is_directory())
      if (std::optional<SaveLeftover> l = save_leftover(e.path())) leftovers.push_back(*l);
  std::sort(leftovers.begin(), leftovers.end(), [](const SaveLeftover& a, const SaveLeftover& b) {
    return a.path < b.path;
  });
  // Killed between the renames: NAME back in place, from the finished temporary when there is one.
  for (const SaveLeftover& old : leftovers) {
    const fs::path checkpoint = fs::path(output_dir_) / old.checkpoint;
    if (old.kind != "old" || fs::exists(checkpoint) || process_is_running(old.pid)) continue;
    const fs::path finished = fs::path(output_dir_) / ("." + old.checkpoint + ".tmp-" + old.pid);
    const fs::path from = fs::is_directory(finished) ? finished : old.path;
    fs::rename(from, checkpoint);
    changes.push_back(checkpoint.string() + ": restored from " + from.filename().string() +
                      (from == finished ? " (a save killed as it moved into place; it had finished writing)"
                                        : " (the older copy a killed save had moved aside)"));
  }
  for (const SaveLeftover& l : leftovers) {
    if (!fs::exists(l.path)) continue;  // restored above
    if (process_is_running(l.pid)) {  // another run's save in progress: not ours to touch
      changes.push_back(l.path.string() + ": left alone (process " + l.pid +
                        " is running: another run writing into this output_dir?)");
      continue;
    }
    fs::remove_all(l.path);
    changes.push_back(l.path.string() + ": removed (" +
                      (l.kind == "tmp" ? "a save that did not finish" : "the older copy a finished save replaced") + ")");
  }
  return changes;
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
