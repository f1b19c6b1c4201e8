// SDK call -> TrainJob object, spelled as the upstream Python SDK spells it
// (kubeflow/trainer/backends/kubernetes/utils.py: get_args_using_torchtune_config,
// get_resources_per_node, get_optional_initializer_envs, get_command_using_train_func).
// Python's str() of bools, floats and dicts is reproduced here because upstream renders args with
// f-strings; tests/runtime compares against the real SDK's output. No checking of the result here.
#include "runtime/trainjob_builder.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <cstdio>
#include <random>
#include <set>
#include <tuple>
#include <variant>

#include "core/error.h"

namespace ktune {

namespace {

std::string py_bool(bool b) { return b ? "True" : "False"; }

// Python's repr(float): the shortest digits that round-trip, fixed notation for 1e-4 <= |x| < 1e16
// (with ".0" when integral), else d.ddde[+-]XX.
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  // buf: [-]d.ddde[+-]XX
  std::string s(buf);
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const size_t e = s.find('e');
  std::string digits = s.substr(0, e);
  const int exponent = std::stoi(s.substr(e + 1));
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      std::string int_part = digits.substr(0, std::min<size_t>(digits.size(), exponent + 1));
      while (static_cast<int>(int_part.size()) < exponent + 1) int_part += '0';
      std::string frac = digits.size() > static_cast<size_t>(exponent + 1) ? digits.substr(exponent + 1) : "0";
      out = int_part + "." + frac;
    } else {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  }
  return negative ? "-" + out : out;
}

// Python's repr(str): single quotes unless the text has ' and no ", escapes as Python does.
std::string py_str_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == static_cast<unsigned char>(quote)) out += std::string("\\") + static_cast<char>(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else out += static_cast<char>(c);
  }
  return out + quote;
}

std::string py_dict(const types::StringDict& d) {
  std::string out = "{";
  for (size_t i = 0; i < d.size(); ++i)
    out += (i ? ", " : "") + py_str_repr(d[i].first) + ": " + py_str_repr(d[i].second);
  return out + "}";
}

// Python's os.path.join(a, b) for an absolute a.
std::string py_path_join(const std::string& a, const std::string& b) {
  if (!b.empty() && b[0] == '/') return b;
  if (a.empty() || a.back() == '/') return a + b;
  return a + "/" + b;
}

// The relative path after org/repo of an HF URI, as upstream computes it with urlparse:
// "hf://org/repo/a/b" -> "a/b"; "hf://org/repo" -> ".".
std::string hf_relative_path(std::string uri) {
  if (uri.rfind("hf://", 0) != 0) uri = "hf://" + uri;
  std::string rest = uri.substr(5);
  const size_t cut = rest.find_first_of("?#");
  if (cut != std::string::npos) rest = rest.substr(0, cut);
  const size_t slash = rest.find('/');
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);  // after the netloc
  // path.strip("/").split("/")
  size_t b = path.find_first_not_of('/');
  size_t e = path.find_last_not_of('/');
  path = b == std::string::npos ? "" : path.substr(b, e - b + 1);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t s = path.find('/', start);
    parts.push_back(path.substr(start, s == std::string::npos ? std::string::npos : s - start));
    if (s == std::string::npos) break;
    start = s + 1;
  }
  if (parts.size() <= 1) return ".";
  std::string rel;
  for (size_t i = 1; i < parts.size(); ++i) rel += (i > 1 ? "/" : "") + parts[i];
  return rel;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

void add_env(std::vector<v1alpha1::EnvVar>& env, const std::string& name, const std::optional<std::string>& value) {
  if (value) env.push_back({name, *value, {}});
}
void add_env(std::vector<v1alpha1::EnvVar>& env, const std::string& name,
             const std::optional<std::vector<std::string>>& value) {
  if (value) env.push_back({name, join(*value, ","), {}});
}

bool has_scheme(const std::string& uri) {
  const size_t p = uri.find("://");
  return p != std::string::npos && p > 0;
}

// Single-quotes for bash.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::vector<std::string> torchtune_args(const types::TorchTuneConfig& config, const types::Initializer* initializer,
                                        bool upstream_exact) {
  std::vector<std::string> args;
  if (config.dtype) args.push_back("dtype=" + types::to_string(*config.dtype));
  if (config.batch_size && *config.batch_size) args.push_back("batch_size=" + std::to_string(*config.batch_size));
  if (config.epochs && *config.epochs) args.push_back("epochs=" + std::to_string(*config.epochs));
  if (config.loss) args.push_back("loss=" + types::to_string(*config.loss));

  if (initializer) {
    const auto* hf = std::get_if<types::HuggingFaceDatasetInitializer>(&initializer->dataset);
    if (hf && hf->storage_uri.rfind("file://", 0) == 0) {
      // ktune: the initializer copies a file:// folder's contents into /workspace/dataset, or a
      // single file to /workspace/dataset/<its name>. A last component with a dot is taken for a
      // file, as upstream takes an hf:// subpath with a dot (the plan never looks at the disk: it
      // must read the same wherever it is made, and a Kubernetes initializer sees other disks).
      std::string path = hf->storage_uri.substr(7);
      while (path.size() > 1 && path.back() == '/') path.pop_back();
      const std::string base = path.substr(path.find_last_of('/') + 1);
      if (!base.empty() && base.find('.') != std::string::npos && base != "." && base != "..")
        args.push_back("dataset.data_files=" + py_path_join(kDatasetPath, base));
      else
        args.push_back(std::string("dataset.data_dir=") + kDatasetPath);
    } else if (hf) {
      const std::string rel = hf_relative_path(hf->storage_uri);
      if (rel != "." && rel.find('.') != std::string::npos)
        args.push_back("dataset.data_files=" + py_path_join(kDatasetPath, rel));
      else
        args.push_back("dataset.data_dir=" + py_path_join(kDatasetPath, rel));
    } else if (std::holds_alternative<types::S3DatasetInitializer>(initializer->dataset) && !upstream_exact) {
      // ktune: the S3 initializer downloads the prefix into /workspace/dataset; point at it.
      args.push_back(std::string("dataset.data_dir=") + kDatasetPath);
    }
  }

  if (config.peft_config) {
    const types::LoraConfig& l = *config.peft_config;
    if (l.apply_lora_to_mlp) args.push_back("model.apply_lora_to_mlp=" + py_bool(*l.apply_lora_to_mlp));
    if (l.apply_lora_to_output) args.push_back("model.apply_lora_to_output=" + py_bool(*l.apply_lora_to_output));
    if (l.lora_rank) args.push_back("model.lora_rank=" + std::to_string(*l.lora_rank));
    if (l.lora_alpha) args.push_back("model.lora_alpha=" + std::to_string(*l.lora_alpha));
    if (l.lora_dropout) args.push_back("model.lora_dropout=" + py_float(*l.lora_dropout));
    if (l.quantize_base) args.push_back("model.quantize_base=" + py_bool(*l.quantize_base));
    if (l.use_dora) args.push_back("model.use_dora=" + py_bool(*l.use_dora));
    if (!l.lora_attn_modules.empty()) args.push_back("model.lora_attn_modules=[" + join(l.lora_attn_modules, ",") + "]");
  }

  if (const auto* d = std::get_if<types::TorchTuneInstructDataset>(&config.dataset_preprocess_config)) {
    args.push_back("dataset=torchtune.datasets.instruct_dataset");
    if (d->source) args.push_back("dataset.source=" + types::to_string(*d->source));
    if (d->split && !d->split->empty()) args.push_back("dataset.split=" + *d->split);
    if (d->train_on_input) args.push_back("dataset.train_on_input=" + py_bool(*d->train_on_input));
    if (d->new_system_prompt && !d->new_system_prompt->empty())
      args.push_back("dataset.new_system_prompt=" + *d->new_system_prompt);
    if (!d->column_map.empty()) args.push_back("dataset.column_map=" + py_dict(d->column_map));
  } else if (const auto* c = std::get_if<types::TorchTuneChatDataset>(&config.dataset_preprocess_config)) {
    if (upstream_exact) throw Error("dataset_preprocess_config", "Invalid dataset preprocess config type: TorchTuneChatDataset");
    args.push_back("dataset=torchtune.datasets.chat_dataset");
    if (c->source) args.push_back("dataset.source=" + types::to_string(*c->source));
    if (c->split && !c->split->empty()) args.push_back("dataset.split=" + *c->split);
    if (c->conversation_column) args.push_back("dataset.conversation_column=" + *c->conversation_column);
    if (c->conversation_style) args.push_back("dataset.conversation_style=" + *c->conversation_style);
    if (c->train_on_input) args.push_back("dataset.train_on_input=" + py_bool(*c->train_on_input));
    if (c->new_system_prompt && !c->new_system_prompt->empty())
      args.push_back("dataset.new_system_prompt=" + *c->new_system_prompt);
  } else if (const auto* m = std::get_if<types::TorchTuneMultimodalDataset>(&config.dataset_preprocess_config)) {
    if (upstream_exact)
      throw Error("dataset_preprocess_config", "Invalid dataset preprocess config type: TorchTuneMultimodalDataset");
    args.push_back("dataset=torchtune.datasets.multimodal.multimodal_chat_dataset");
    if (m->source) args.push_back("dataset.source=" + types::to_string(*m->source));
    if (m->split && !m->split->empty()) args.push_back("dataset.split=" + *m->split);
    if (!m->column_map.empty()) args.push_back("dataset.column_map=" + py_dict(m->column_map));
    if (m->image_dir) args.push_back("dataset.image_dir=" + *m->image_dir);
    if (m->image_tag) args.push_back("dataset.image_tag=" + *m->image_tag);
  }
  return args;
}

v1alpha1::ResourceRequirements resources_per_node(const types::StringDict& resources) {
  static const std::set<std::string> standard{"cpu", "memory", "gpu", "storage", "ephemeral-storage"};
  v1alpha1::ResourceRequirements r;
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : resources) {
    std::string key = standard.count(lower(k)) || lower(k).rfind("mig-", 0) == 0 ? lower(k) : k;
    if (key == "gpu") key = "nvidia.com/gpu";
    if (key == "storage") key = "ephemeral-storage";
    if (key.rfind("mig-", 0) == 0) key = "nvidia.com/mig-" + key.substr(4);
    out[key] = v;
  }
  std::vector<std::string> mig;
  for (const auto& [k, v] : out)
    if (k.rfind("nvidia.com/mig-", 0) == 0) mig.push_back(k);
  if (mig.size() > 1) throw Error("resources_per_node", "Multiple MIG resource types are not supported: " + join(mig, ", "));
  if (!mig.empty() && out.count("nvidia.com/gpu"))
    throw Error("resources_per_node", "GPU (nvidia.com/gpu) and MIG (" + mig[0] + ") cannot be requested together");
  r.limits = out;
  r.requests = out;
  return r;
}

namespace {

// A Hugging Face initializer (dataset or model: the same fields) as the step's storage URI and env.
template <typename HuggingFace>
v1alpha1::InitializerSpec hugging_face_spec(const HuggingFace& hf) {
  v1alpha1::InitializerSpec s;
  // ktune: a bare "org/repo" (as the design's example writes it) becomes hf://org/repo, so the
  // initializer never has to guess the provider; a local path is refused, not made a repo id.
  const std::string& uri = hf.storage_uri;
  if (!has_scheme(uri) && (uri.empty() || uri.front() == '/' || uri.front() == '.' || uri.front() == '~'))
    throw Error("storage_uri '" + uri + "'", uri.empty() ? "empty: give hf://org/repo"
                                                         : "a local path, not a Hugging Face repo: write file://" + uri +
                                                               " for a folder the initializer copies");
  s.storage_uri = has_scheme(uri) ? uri : "hf://" + uri;
  add_env(s.env, "IGNORE_PATTERNS", hf.ignore_patterns);
  add_env(s.env, "ACCESS_TOKEN", hf.access_token);
  return s;
}

// An S3 initializer (dataset or model: the same fields) as the step's storage URI and env.
template <typename S3>
v1alpha1::InitializerSpec s3_spec(const S3& s3) {
  v1alpha1::InitializerSpec s;
  s.storage_uri = s3.storage_uri;
  add_env(s.env, "IGNORE_PATTERNS", s3.ignore_patterns);
  add_env(s.env, "ENDPOINT", s3.endpoint);
  add_env(s.env, "ACCESS_KEY_ID", s3.access_key_id);
  add_env(s.env, "SECRET_ACCESS_KEY", s3.secret_access_key);
  add_env(s.env, "REGION", s3.region);
  add_env(s.env, "ROLE_ARN", s3.role_arn);
  return s;
}

}  // namespace

// A data cache as upstream renders it: CLUSTER_SIZE (the data nodes and the head) and METADATA_LOC,
// then the optional fields that are set, in the dataclass's order. Upstream's checks first.
static v1alpha1::InitializerSpec data_cache_spec(const types::DataCacheInitializer& cache) {
  std::vector<Error> bad;
  if (cache.num_data_nodes <= 1)
    bad.emplace_back("initializer.dataset.num_data_nodes", "must be greater than 1, got " + std::to_string(cache.num_data_nodes));
  const std::string prefix = "cache://";
  const std::string path = cache.storage_uri.rfind(prefix, 0) == 0 ? cache.storage_uri.substr(prefix.size()) : "";
  const size_t slash = path.find('/');
  if (path.empty() || slash == std::string::npos || path.find('/', slash + 1) != std::string::npos)
    bad.emplace_back("initializer.dataset.storage_uri",
                     "must be in format 'cache://<SCHEMA_NAME>/<TABLE_NAME>', got '" + cache.storage_uri + "'");
  if (cache.metadata_loc.empty()) bad.emplace_back("initializer.dataset.metadata_loc", "must name the Iceberg table's metadata file");
  if (!bad.empty()) throw Errors(std::move(bad));
  v1alpha1::InitializerSpec s;
  s.storage_uri = cache.storage_uri;
  add_env(s.env, "CLUSTER_SIZE", std::optional<std::string>(std::to_string(cache.num_data_nodes + 1)));
  add_env(s.env, "METADATA_LOC", std::optional<std::string>(cache.metadata_loc));
  add_env(s.env, "HEAD_CPU", cache.head_cpu);
  add_env(s.env, "HEAD_MEM", cache.head_mem);
  add_env(s.env, "WORKER_CPU", cache.worker_cpu);
  add_env(s.env, "WORKER_MEM", cache.worker_mem);
  add_env(s.env, "IAM_ROLE", cache.iam_role);
  return s;
}

v1alpha1::Initializer trainjob_initializer(const types::Initializer& initializer) {
  v1alpha1::Initializer out;
  if (const auto* hf = std::get_if<types::HuggingFaceDatasetInitializer>(&initializer.dataset))
    out.dataset = hugging_face_spec(*hf);
  else if (const auto* s3 = std::get_if<types::S3DatasetInitializer>(&initializer.dataset))
    out.dataset = s3_spec(*s3);
  else if (const auto* cache = std::get_if<types::DataCacheInitializer>(&initializer.dataset))
    out.dataset = data_cache_spec(*cache);
  if (const auto* hf = std::get_if<types::HuggingFaceModelInitializer>(&initializer.model))
    out.model = hugging_face_spec(*hf);
  else if (const auto* s3 = std::get_if<types::S3ModelInitializer>(&initializer.model))
    out.model = s3_spec(*s3);
  return out;
}

void check_torchtune_config(const types::TorchTuneConfig& config) {
  std::vector<Error> bad;
  auto at_least = [&](const std::optional<int>& value, const std::string& field, int min) {
    if (value && *value < min)
      bad.emplace_back("trainer.config." + field, "expected at least " + std::to_string(min) + ", got " + std::to_string(*value));
  };
  at_least(config.batch_size, "batch_size", 1);
  at_least(config.epochs, "epochs", 1);
  at_least(config.num_nodes, "num_nodes", 1);
  if (config.peft_config) {
    const types::LoraConfig& l = *config.peft_config;
    at_least(l.lora_rank, "peft_config.lora_rank", 1);
    at_least(l.lora_alpha, "peft_config.lora_alpha", 1);
    if (l.lora_dropout && !(*l.lora_dropout >= 0.0 && *l.lora_dropout < 1.0))
      bad.emplace_back("trainer.config.peft_config.lora_dropout",
                       "expected from 0 up to, not including, 1, got " + py_float(*l.lora_dropout));
    // torchtune's attention projections (the trainer's schema checks the same names): caught here, a
    // mistake fails the call instead of the job after its downloads. The list also picks the recipe:
    // an empty one would plan a full fine-tune that refuses the LoRA keys.
    static const std::vector<std::string> kAttnModules{"q_proj", "k_proj", "v_proj", "output_proj"};
    const std::string modules_field = "trainer.config.peft_config.lora_attn_modules";
    if (l.lora_attn_modules.empty())
      bad.emplace_back(modules_field, "empty: a LoRA fine-tune adapts at least one of " + join(kAttnModules, ", ") +
                                          " (the list picks the LoRA recipe; leave it out for upstream's default)");
    for (const std::string& m : l.lora_attn_modules)
      if (std::find(kAttnModules.begin(), kAttnModules.end(), m) == kAttnModules.end())
        bad.emplace_back(modules_field, "'" + m + "' is not one of " + join(kAttnModules, ", ") +
                                            " (the MLP's projections take apply_lora_to_mlp)");
  }
  if (!bad.empty()) throw Errors(std::move(bad));
}

// The here-document's end marker: upstream's EOM, unless a line of the script is exactly that (a
// string holding "EOM" would end the here-document early and run the rest as bash): then EOM_1, ...
static std::string heredoc_delimiter(const std::string& script) {
  auto is_a_line = [&](const std::string& marker) {
    for (std::size_t start = 0; start <= script.size();) {
      std::size_t end = script.find('\n', start);
      if (end == std::string::npos) end = script.size();
      if (script.compare(start, end - start, marker) == 0) return true;
      start = end + 1;
    }
    return false;
  };
  std::string marker = "EOM";
  for (int n = 1; is_a_line(marker); ++n) marker = "EOM_" + std::to_string(n);
  return marker;
}

// Upstream's TrainerCommand / TrainerArgs: .spec.trainer.command / .args, over a
// CustomTrainerContainer or no trainer; a CustomTrainer makes its own command from its function and
// a BuiltinTrainer has the runtime's, so with those they are refused (in upstream's words).
static void apply_trainer_overrides(const types::Trainer& trainer, const types::JobOptions& options, v1alpha1::TrainJob& job) {
  if (!options.trainer_command && !options.trainer_args) return;
  const bool takes_overrides = std::holds_alternative<std::monostate>(trainer) ||
                               std::holds_alternative<types::CustomTrainerContainer>(trainer);
  for (const auto& [given, option, own, preconfigured] :
       {std::tuple{bool(options.trainer_command), "TrainerCommand", "command", "commands"},
        std::tuple{bool(options.trainer_args), "TrainerArgs", "arguments", "arguments"}})
    if (given && !takes_overrides)
      throw Errors({Error(option, std::string(option) + " can only be used with CustomTrainerContainer. CustomTrainer generates its own " +
                                      own + " from the function, and BuiltinTrainer uses pre-configured " + preconfigured + ".")});
  if (!job.spec.trainer) job.spec.trainer = v1alpha1::Trainer{};
  if (options.trainer_command) job.spec.trainer->command = *options.trainer_command;
  if (options.trainer_args) job.spec.trainer->args = *options.trainer_args;
}

v1alpha1::TrainJob make_trainjob(const types::Runtime& runtime, const types::Initializer* initializer,
                                 const types::Trainer& trainer, const types::JobOptions& options) {
  v1alpha1::TrainJob job;
  job.metadata.name = options.name.empty() ? generate_job_name() : options.name;
  job.metadata.labels = options.labels;
  job.metadata.annotations = options.annotations;
  job.spec.active_deadline_seconds = options.active_deadline_seconds;
  job.spec.runtime_ref.name = runtime.name;
  job.spec.runtime_ref.kind = types::to_string(runtime.kind);
  if (initializer) {
    v1alpha1::Initializer init = trainjob_initializer(*initializer);
    if (init.dataset || init.model) job.spec.initializer = init;
  }
  if (const auto* b = std::get_if<types::BuiltinTrainer>(&trainer)) {
    check_torchtune_config(b->config);
    v1alpha1::Trainer t;
    if (b->config.num_nodes && *b->config.num_nodes) t.num_nodes = *b->config.num_nodes;
    if (!b->config.resources_per_node.empty()) t.resources_per_node = resources_per_node(b->config.resources_per_node);
    // Always `tune run`: on a runtime that is not torchtune's, validation then names the mistake.
    t.command = {"tune", "run"};
    t.args = torchtune_args(b->config, initializer);
    job.spec.trainer = t;
  } else if (const auto* c = std::get_if<types::CustomTrainer>(&trainer)) {
    v1alpha1::Trainer t;
    if (c->num_nodes && *c->num_nodes) t.num_nodes = *c->num_nodes;
    if (!c->resources_per_node.empty()) t.resources_per_node = resources_per_node(c->resources_per_node);
    if (!c->command.empty() && !c->script.empty())
      throw Error("CustomTrainer", "set either command or script, not both");
    if (c->command.empty() && c->script.empty()) throw Error("CustomTrainer", "needs a command or a script");
    if (!c->command.empty()) {
      t.command = c->command;
      t.args = c->args;
    } else {
      // As upstream embeds a function: write the script into the working directory, install the
      // packages, and start it with the runtime's entrypoint (torchrun for torch runtimes).
      std::string entry = runtime.trainer.command.empty() ? "python" : join(runtime.trainer.command, " ");
      std::string script;
      if (!c->packages_to_install.empty()) script += pip_install_script(c->packages_to_install, c->pip_index_urls);
      const std::string eom = heredoc_delimiter(c->script);
      script += "read -r -d '' SCRIPT << '" + eom + "'\n" + c->script + "\n" + eom + "\n";
      script += "printf \"%s\" \"$SCRIPT\" > \"ktune_train.py\"\n";
      script += entry + " \"ktune_train.py\"";
      for (const std::string& a : c->args) script += " " + sh_quote(a);
      t.command = {"bash", "-c", script};
    }
    for (const auto& [k, v] : c->env) t.env.push_back({k, v, {}});
    if (c->image) t.image = *c->image;
    job.spec.trainer = t;
  } else if (const auto* c = std::get_if<types::CustomTrainerContainer>(&trainer)) {
    if (runtime.trainer.trainer_type != types::TrainerType::CustomTrainer)  // upstream's words
      throw Error("CustomTrainerContainer", "CustomTrainer can't be used with runtime " + runtime.name +
                                                " (a BuiltinTrainer runtime); use a runtime such as torch-distributed");
    if (c->image.empty()) throw Error("CustomTrainerContainer.image", "must name the container image to run");
    v1alpha1::Trainer t;
    if (c->num_nodes && *c->num_nodes) t.num_nodes = *c->num_nodes;
    if (!c->resources_per_node.empty()) t.resources_per_node = resources_per_node(c->resources_per_node);
    t.image = c->image;
    for (const auto& [k, v] : c->env) t.env.push_back({k, v, {}});
    job.spec.trainer = t;
  }
  apply_trainer_overrides(trainer, options, job);
  return job;
}

std::vector<std::string> kubernetes_only_parts(const types::Initializer* initializer, const types::Trainer& trainer,
                                               const types::JobOptions& options) {
  std::vector<std::string> parts;
  if (initializer && std::holds_alternative<types::DataCacheInitializer>(initializer->dataset))
    parts.push_back("DataCacheInitializer");
  if (std::holds_alternative<types::CustomTrainerContainer>(trainer)) parts.push_back("CustomTrainerContainer");
  if (options.trainer_command) parts.push_back("TrainerCommand");
  if (options.trainer_args) parts.push_back("TrainerArgs");
  return parts;
}

// The lines a function's script starts with to install its packages, with upstream's policy: for
// the user first, then system-wide (an image whose Python is a virtual environment refuses --user),
// both allowed past PEP 668's externally-managed marker; pip's output kept in a log shown only when
// both fail, and then the script stops (exit 1) rather than start a function without its packages.
std::string pip_install_script(const std::vector<std::string>& packages, const std::vector<std::string>& index_urls) {
  std::vector<std::string> quoted;
  for (const auto& p : packages) quoted.push_back(sh_quote(p));
  std::string options = "--index-url " + sh_quote(index_urls.empty() ? "https://pypi.org/simple" : index_urls[0]);
  for (size_t i = 1; i < index_urls.size(); ++i) options += " --extra-index-url " + sh_quote(index_urls[i]);
  const std::string pip = "PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_BREAK_SYSTEM_PACKAGES=1 python -m pip install --quiet "
                          "--no-warn-script-location " + options;
  std::string s;
  s += "if ! [ -x \"$(command -v pip)\" ]; then python -m ensurepip || python -m ensurepip --user; fi\n";
  s += "KTUNE_PACKAGES=(" + join(quoted, " ") + ")\n";
  s += "if " + pip + " --user \"${KTUNE_PACKAGES[@]}\" > pip_install.log 2>&1; then\n";
  s += "  echo \"installed Python packages (user): ${KTUNE_PACKAGES[*]}\"\n";
  s += "elif " + pip + " \"${KTUNE_PACKAGES[@]}\" >> pip_install.log 2>&1; then\n";
  s += "  echo \"installed Python packages (system-wide): ${KTUNE_PACKAGES[*]}\"\n";
  s += "else\n";
  s += "  echo \"ERROR: failed to install Python packages: ${KTUNE_PACKAGES[*]}\" >&2\n";
  s += "  cat pip_install.log >&2\n";
  s += "  exit 1\n";
  s += "fi\n";
  return s;
}

std::string generate_job_name() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^
                                          static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count())};
  static const char* hex = "0123456789abcdef";
  std::string name(1, static_cast<char>('a' + rng() % 26));
  for (int i = 0; i < 11; ++i) name += hex[rng() % 16];
  return name;
}

bool is_secret_env_name(const std::string& name) {
  static const std::set<std::string> names{"ACCESS_TOKEN", "SECRET_ACCESS_KEY", "ACCESS_KEY_ID", "HF_TOKEN",
                                           "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN"};
  if (names.count(name)) return true;
  for (const char* suffix : {"_TOKEN", "_SECRET", "_PASSWORD", "_SECRET_KEY"})
    if (name.size() > std::strlen(suffix) && name.compare(name.size() - std::strlen(suffix), std::string::npos, suffix) == 0)
      return true;
  return false;
}

}  // namespace ktune
