// `ktune train --runtime NAME [...]`: TrainerClient::train() from the shell. Flags fill the SDK's
// types (Initializer with its ignore patterns, BuiltinTrainer with a TorchTuneConfig, its
// LoraConfig, resources and loss, and an instruct or chat dataset config; or a CustomTrainer, a
// script or a command, or a CustomTrainerContainer, an image): the Python SDK's shapes, one flag a
// field; the control plane
// validates and plans; the backend (local by default) starts the job and this prints its name on
// stdout (hints on stderr). --dry-run prints the plan instead; --follow streams node-0's log;
// --wait blocks until the job ends (exit 0 Complete, 1 Failed, 3 timeout).
// Access tokens never go on the command line (ps shows argv): they come from HF_TOKEN (Hugging
// Face) and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (S3) in the environment.
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "cli/job_wait.h"
#include "core/error.h"
#include "sdk/kubernetes_backend.h"
#include "sdk/trainer_client.h"

namespace ktune::cli {

namespace {

int train_usage(FILE* to) {
  std::fprintf(to,
               "usage: ktune train --runtime NAME [--model URI] [--dataset URI] [--name NAME] [--dry-run]\n"
               "         [--wait] [--follow] [--timeout SECONDS] [trainer flags] [dataset flags]\n"
               "         [--label KEY=VALUE]... [--annotation KEY=VALUE]... [--active-deadline-seconds N] (Kubernetes)\n"
               "  trainer (TorchTuneConfig): --epochs N --batch-size N --dtype bf16|fp32 --num-nodes N\n"
               "         --resources KEY=VALUE... (resources_per_node: gpu=2, cpu=4, memory=16Gi)\n"
               "         --loss torchtune.modules.loss.CEWithChunkedOutputLoss\n"
               "  LoRA (LoraConfig; any of them makes the job a LoRA one): --lora-rank N --lora-alpha N\n"
               "         --lora-dropout P --lora-attn-modules q_proj,v_proj,... --apply-lora-to-mlp[=false]\n"
               "         --apply-lora-to-output[=false] --quantize-base (QLoRA) --use-dora (DoRA)\n"
               "  dataset (TorchTuneInstructDataset, or TorchTuneChatDataset with a conversation flag):\n"
               "         --dataset-format json|csv|parquet|arrow|text --split SPLIT --train-on-input[=false]\n"
               "         --new-system-prompt TEXT --column-map KEY=COLUMN... (instruct)\n"
               "         --conversation-column COLUMN --conversation-style sharegpt|openai (chat)\n"
               "  model initializer: --model-ignore-patterns '*.bin,*.pt' (comma-separated)\n"
               "  custom trainer (CustomTrainer, instead of the torchtune flags): --script FILE (a Python\n"
               "         script run with the runtime's entrypoint) or --command ARG... (repeated: the argv),\n"
               "         --arg ARG... --env KEY=VALUE... --packages a,b --pip-index-url URL... --num-nodes N\n"
               "         --resources KEY=VALUE...; --image IMAGE makes it a CustomTrainerContainer (Kubernetes)\n"
               "  URIs: hf://org/repo[/path] (or org/repo) and s3://bucket/path.\n"
               "  Tokens from the environment: HF_TOKEN; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,\n"
               "  AWS_ENDPOINT_URL. Backend: KTUNE_BACKEND (local), KTUNE_HOME (~/.ktune), or --backend kubernetes\n"
               "  [--namespace NS] [--kubeconfig PATH] [--context NAME] (--dry-run then prints the TrainJob YAML).\n");
  return to == stdout ? 0 : 2;
}

std::vector<std::string> comma_list(const std::string& flag, const std::string& value) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t comma = value.find(',', start);
    std::string item = value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (item.empty()) throw Error("ktune train " + flag, "expects a comma-separated list without empty items, got '" + value + "'");
    out.push_back(item);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::pair<std::string, std::string> key_value(const std::string& flag, const std::string& value) {
  const std::size_t eq = value.find('=');
  if (eq == std::string::npos || eq == 0) throw Error("ktune train " + flag, "expects KEY=VALUE, got '" + value + "'");
  return {value.substr(0, eq), value.substr(eq + 1)};
}

// The dataset flags, gathered before they become the SDK's instruct or chat dataset config.
struct DatasetFlags {
  std::optional<types::DataFormat> source;
  std::optional<std::string> split, new_system_prompt, conversation_column, conversation_style;
  std::optional<bool> train_on_input;
  types::StringDict column_map;
  bool any() const {
    return source || split || new_system_prompt || conversation_column || conversation_style || train_on_input ||
           !column_map.empty();
  }
  types::DatasetPreprocessConfig to_config() const {
    if (conversation_column || conversation_style) {
      if (!column_map.empty())
        throw Error("ktune train --column-map", "is an instruct dataset's; a chat dataset (--conversation-column/"
                                                "--conversation-style) names its column with --conversation-column");
      types::TorchTuneChatDataset chat;
      chat.source = source, chat.split = split, chat.conversation_column = conversation_column;
      chat.conversation_style = conversation_style, chat.train_on_input = train_on_input;
      chat.new_system_prompt = new_system_prompt;
      return chat;
    }
    types::TorchTuneInstructDataset instruct;
    instruct.source = source, instruct.split = split, instruct.train_on_input = train_on_input;
    instruct.new_system_prompt = new_system_prompt, instruct.column_map = column_map;
    return instruct;
  }
};

// The custom trainer flags, gathered before they become a CustomTrainer (a script or a command)
// or, with --image, a CustomTrainerContainer.
struct CustomFlags {
  std::optional<std::string> script_file, image;
  std::vector<std::string> command, args, packages, pip_index_urls;
  types::StringDict env;
  bool any() const {
    return script_file || image || !command.empty() || !args.empty() || !packages.empty() || !pip_index_urls.empty() ||
           !env.empty();
  }
  types::Trainer to_trainer(const types::TorchTuneConfig& shared) const {
    if (image) {
      if (script_file || !command.empty() || !args.empty() || !packages.empty() || !pip_index_urls.empty())
        throw Error("ktune train --image", "a CustomTrainerContainer runs its image's own program: --script, --command, "
                                           "--arg, --packages and --pip-index-url are a CustomTrainer's");
      types::CustomTrainerContainer c;
      c.image = *image, c.num_nodes = shared.num_nodes, c.resources_per_node = shared.resources_per_node, c.env = env;
      return c;
    }
    if (script_file.has_value() == !command.empty())
      throw Error("ktune train", "a CustomTrainer runs a --script FILE or a --command, one of the two");
    if (!command.empty() && (!packages.empty() || !pip_index_urls.empty()))
      throw Error("ktune train --packages", "packages are installed before a --script runs; a --command runs as given "
                                            "(install them in it, or in the image)");
    types::CustomTrainer c;
    if (script_file) {
      std::ifstream in(*script_file, std::ios::binary);
      if (!in) throw Error("ktune train --script " + *script_file, "cannot read the script");
      c.script.assign(std::istreambuf_iterator<char>(in), {});
    }
    c.command = command, c.args = args, c.env = env, c.packages_to_install = packages;
    if (!pip_index_urls.empty()) {
      c.pip_index_urls = pip_index_urls;
    } else if (const char* urls = std::getenv("DEFAULT_PIP_INDEX_URLS"); urls != nullptr && *urls) {
      c.pip_index_urls = comma_list("DEFAULT_PIP_INDEX_URLS", urls);  // as the Python SDK (upstream) reads it
    }
    c.num_nodes = shared.num_nodes, c.resources_per_node = shared.resources_per_node;
    return c;
  }
};

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v && *v) return std::string(v);
  return std::nullopt;
}

bool is_s3(const std::string& uri) { return uri.rfind("s3://", 0) == 0; }

// The initializer for a --dataset/--model URI (dataset or model: the same fields): S3 with the AWS_*
// credentials of this environment, else the Hugging Face Hub with HF_TOKEN.
template <typename S3, typename HuggingFace, typename Variant>
Variant initializer_for(const std::string& uri) {
  if (is_s3(uri)) {
    S3 s3;
    s3.storage_uri = uri;
    s3.endpoint = env("AWS_ENDPOINT_URL");
    s3.access_key_id = env("AWS_ACCESS_KEY_ID");
    s3.secret_access_key = env("AWS_SECRET_ACCESS_KEY");
    s3.region = env("AWS_REGION");
    return s3;
  }
  HuggingFace hf;
  hf.storage_uri = uri;
  hf.access_token = env("HF_TOKEN");
  return hf;
}

}  // namespace

int cmd_train(const Args& args) {
  std::string runtime_name, model_uri, dataset_uri;
  types::JobOptions options;
  bool dry_run = false, wait = false, follow = false;
  double timeout = 0;
  types::TorchTuneConfig config;
  std::optional<types::LoraConfig> lora;
  DatasetFlags dataset;
  std::optional<std::vector<std::string>> model_ignore_patterns;
  CustomFlags custom;
  auto lora_config = [&]() -> types::LoraConfig& {
    if (!lora) lora.emplace();
    return *lora;
  };
  sdk::BackendConfig backend = sdk::BackendConfig::from_env();
  FlagArgs a("ktune train", args);
  constexpr long long kMany = 1000000;
  while (a.next()) {
    if (a.help()) return train_usage(stdout);
    if (a.is("--dry-run")) { a.expect_no_value(); dry_run = true; continue; }
    if (a.is("--wait")) { a.expect_no_value(); wait = true; continue; }
    if (a.is("--follow") || a.is("-f")) { a.expect_no_value(); follow = true; continue; }
    if (a.is("--apply-lora-to-mlp")) { lora_config().apply_lora_to_mlp = a.switch_value(); continue; }
    if (a.is("--apply-lora-to-output")) { lora_config().apply_lora_to_output = a.switch_value(); continue; }
    if (a.is("--quantize-base")) { lora_config().quantize_base = a.switch_value(); continue; }
    if (a.is("--use-dora")) { lora_config().use_dora = a.switch_value(); continue; }
    if (a.is("--train-on-input")) { dataset.train_on_input = a.switch_value(); continue; }
    if (a.is("--lora-dropout")) {
      const double p = a.number_value();
      if (!(p >= 0 && p < 1)) throw Error("ktune train --lora-dropout", "expects a probability in [0, 1), got " + std::to_string(p));
      lora_config().lora_dropout = p;
      continue;
    }
    const std::string flag = a.arg();
    if (flag == "--active-deadline-seconds") {
      options.active_deadline_seconds = a.int_value(1, std::numeric_limits<std::int32_t>::max());
      continue;
    }
    if (flag == "--epochs" || flag == "--batch-size" || flag == "--num-nodes" || flag == "--lora-rank" ||
        flag == "--lora-alpha") {
      const int n = int(a.int_value(1, kMany));
      if (flag == "--epochs") config.epochs = n;
      else if (flag == "--batch-size") config.batch_size = n;
      else if (flag == "--num-nodes") config.num_nodes = n;
      else if (flag == "--lora-rank") lora_config().lora_rank = n;
      else lora_config().lora_alpha = n;
      continue;
    }
    const std::string value = a.value();
    if (backend.apply_flag(flag, value)) continue;
    if (flag == "--runtime") runtime_name = value;
    else if (flag == "--model") model_uri = value;
    else if (flag == "--dataset") dataset_uri = value;
    else if (flag == "--name") options.name = value;
    else if (flag == "--label" || flag == "--annotation") {
      const std::size_t eq = value.find('=');
      if (eq == std::string::npos) throw Error("ktune train " + flag, "expects KEY=VALUE, got '" + value + "'");
      (flag == "--label" ? options.labels : options.annotations)[value.substr(0, eq)] = value.substr(eq + 1);
    }
    else if (flag == "--resources") config.resources_per_node.push_back(key_value(flag, value));
    else if (flag == "--loss") {
      config.loss = types::loss_from_string(value);
      if (!config.loss) throw Error("ktune train --loss", "expects torchtune.modules.loss.CEWithChunkedOutputLoss, got '" + value + "'");
    } else if (flag == "--lora-attn-modules") lora_config().lora_attn_modules = comma_list(flag, value);
    else if (flag == "--dataset-format") {
      dataset.source = types::data_format_from_string(value);
      if (!dataset.source) throw Error("ktune train --dataset-format", "expects json, csv, parquet, arrow or text, got '" + value + "'");
    } else if (flag == "--split") dataset.split = value;
    else if (flag == "--new-system-prompt") dataset.new_system_prompt = value;
    else if (flag == "--column-map") dataset.column_map.push_back(key_value(flag, value));
    else if (flag == "--conversation-column") dataset.conversation_column = value;
    else if (flag == "--conversation-style") {
      if (value != "sharegpt" && value != "openai")
        throw Error("ktune train --conversation-style", "expects sharegpt or openai, got '" + value + "'");
      dataset.conversation_style = value;
    } else if (flag == "--model-ignore-patterns") model_ignore_patterns = comma_list(flag, value);
    else if (flag == "--script") custom.script_file = value;
    else if (flag == "--image") custom.image = value;
    else if (flag == "--command") custom.command.push_back(value);
    else if (flag == "--arg") custom.args.push_back(value);
    else if (flag == "--env") custom.env.push_back(key_value(flag, value));
    else if (flag == "--packages") custom.packages = comma_list(flag, value);
    else if (flag == "--pip-index-url") custom.pip_index_urls.push_back(value);
    else if (flag == "--dtype") {
      config.dtype = types::data_type_from_string(value);
      if (!config.dtype) throw Error("ktune train --dtype", "expects bf16 or fp32, got '" + value + "'");
    } else if (flag == "--timeout") {
      timeout = std::atof(value.c_str());
      if (!(timeout > 0)) throw Error("ktune train --timeout", "expects a positive number of seconds, got '" + value + "'");
    } else {
      std::fprintf(stderr, "ktune train: unknown flag %s\n", flag.c_str());
      return train_usage(stderr);
    }
  }
  if (runtime_name.empty()) {
    std::fprintf(stderr, "ktune train: --runtime is required (see `ktune runtimes`)\n");
    return train_usage(stderr);
  }
  if (custom.any() && (lora || dataset.any() || config.epochs || config.batch_size || config.dtype || config.loss))
    throw Error("ktune train", "the custom trainer's flags (--script, --command, --image, ...) do not mix with the "
                               "torchtune trainer's (--epochs, --batch-size, --dtype, --loss, LoRA and dataset flags)");
  if (lora) config.peft_config = lora;
  if (dataset.any()) config.dataset_preprocess_config = dataset.to_config();
  const types::Trainer trainer = custom.any() ? custom.to_trainer(config) : types::Trainer(types::BuiltinTrainer{config});

  types::Initializer initializer;
  if (!dataset_uri.empty())
    initializer.dataset = initializer_for<types::S3DatasetInitializer, types::HuggingFaceDatasetInitializer,
                                          types::DatasetInitializer>(dataset_uri);
  if (!model_uri.empty()) {
    initializer.model = initializer_for<types::S3ModelInitializer, types::HuggingFaceModelInitializer,
                                        types::ModelInitializer>(model_uri);
    if (model_ignore_patterns)
      std::visit([&](auto& m) {
        if constexpr (requires { m.ignore_patterns; }) m.ignore_patterns = *model_ignore_patterns;
      }, initializer.model);
  } else if (model_ignore_patterns) {
    throw Error("ktune train --model-ignore-patterns", "applies to the model initializer: give --model URI too");
  }

  sdk::TrainerClient client(backend);
  const types::Runtime runtime = client.get_runtime(runtime_name);
  TrainJobPlan plan = client.plan(runtime, &initializer, trainer, options);
  if (dry_run) {
    if (auto* k8s = dynamic_cast<sdk::KubernetesBackend*>(&client.backend())) {
      // Exactly the object the backend would POST (secret values live in the Secret, never here).
      std::fputs(v1alpha1::to_yaml(k8s->trainjob_object(plan)).c_str(), stdout);
      if (!plan.secret_name.empty()) {
        std::string keys;
        for (const auto& [k, v] : plan.secret_data) keys += (keys.empty() ? "" : ", ") + k;
        std::fprintf(stderr, "and first the Secret %s/%s with keys: %s\n", k8s->kubernetes_namespace().c_str(),
                     plan.secret_name.c_str(), keys.c_str());
      }
    } else {
      std::fputs(plan.to_text().c_str(), stdout);
    }
    return 0;
  }
  const std::string job = client.submit(plan);
  std::printf("%s\n", job.c_str());
  std::fflush(stdout);
  const std::string what = plan.recipe.empty() ? plan.trainer_type : plan.recipe + ", " + plan.config;
  std::fprintf(stderr, "TrainJob %s started on the %s backend (%s)\n  follow: ktune jobs logs -f %s\n", job.c_str(),
               client.backend().kind().c_str(), what.c_str(), job.c_str());
  if (follow) {
    client.get_job_logs(job, "node-0", true, [](const std::string& line) {
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
      return true;
    });
  }
  if (!wait && !follow) return 0;
  return wait_exit_code(client, job, {types::kTrainJobComplete}, timeout > 0 ? timeout : 1e9, follow ? 0.2 : 1.0,
                        [&job](const types::TrainJob& done) {
                          std::fprintf(stderr, "TrainJob %s %s\n", job.c_str(), done.status.c_str());
                        });
}

}  // namespace ktune::cli
