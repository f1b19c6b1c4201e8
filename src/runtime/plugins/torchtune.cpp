// The torchtune mutation (upstream's torchtune half of the Torch plugin): when the TrainJob's
// command is exactly `tune run`, the node runs
//   tune run [--rdzv_endpoint=<job>-node-0-0.<job>:29500] RECIPE --config CONFIG
//            <runtime-owned overrides> [<runtime dataset defaults>] <the user's args>
// with RECIPE and CONFIG from the recipe table, the model key from the runtime's name, the
// rendezvous only when more than one process runs, and the runtime-owned overrides (output_dir,
// tokenizer.path, tokenizer.merges_file, checkpointer.checkpoint_dir) taken from the runtime's
// node command. It also holds the torchtune rules validation reports.
//
// ktune addition (upstream-compat.md: "a bare hf://org/repo dataset crashes the default dataset",
// "S3 datasets silently train on the default dataset"): when the user's args choose no dataset
// component (`dataset=`), the runtime's own dataset args (`dataset=`, `dataset.source=`,
// `dataset.data_dir=`) are kept as defaults before the user's args, less the location when the
// user gives one, and with `dataset.source` read from a data_files extension. A job that names
// its dataset component gets exactly upstream's command.
#include <algorithm>
#include <map>
#include <set>

#include "runtime/plugins.h"
#include "runtime/recipe_table.h"

namespace ktune {

namespace {

std::string key_of(const std::string& arg) {
  std::string key = arg.substr(0, arg.find('='));
  if (!key.empty() && key[0] == '~') key = key.substr(1);  // `~key` deletes a key: owned keys too
  return key;
}

bool is_runtime_owned(const std::string& key) {
  const auto& owned = runtime_owned_keys();
  return std::find(owned.begin(), owned.end(), key) != owned.end();
}

std::vector<std::string> runtime_node_args(const RuntimeInfo& info) {
  std::vector<std::string> all = info.node.command;
  all.insert(all.end(), info.node.args.begin(), info.node.args.end());
  return all;
}

std::string list_configs(const ConfigSet& configs, const std::string& model_key) {
  std::string out;
  for (const std::string& c : configs.for_model(model_key)) out += (out.empty() ? "" : ", ") + c;
  return out.empty() ? "none" : out;
}

// "x/y.jsonl" -> "json", ".csv" -> "csv", ...; "" when the extension names no format.
std::string source_of_file(const std::string& path) {
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos) return "";
  std::string ext = path.substr(dot + 1);
  static const std::map<std::string, std::string> formats{{"json", "json"}, {"jsonl", "json"}, {"csv", "csv"},
                                                          {"parquet", "parquet"}, {"arrow", "arrow"},
                                                          {"txt", "text"}, {"text", "text"}};
  auto it = formats.find(ext);
  return it == formats.end() ? "" : it->second;
}

class TorchTunePlugin : public Plugin {
 public:
  const char* name() const override { return "TorchTune"; }

  void enforce_ml_policy(RuntimeInfo& info) const override {
    if (info.runtime->framework() != "torchtune") return;
    info.model_key = model_key_from_runtime_name(info.runtime->metadata.name);
    if (info.torchtune_entrypoint()) {
      const RecipeChoice c =
          select_recipe(info.model_key, info.num_nodes, info.num_proc_per_node, info.trainer.args, *info.configs);
      info.recipe = c.recipe;
      info.config = c.config;
    } else {
      // The runtime's own command runs as written: read its recipe and config back for the plan.
      const std::vector<std::string>& cmd = info.node_command;
      for (size_t i = 2; i < cmd.size(); ++i) {
        if (cmd[i] == "--config" && i + 1 < cmd.size()) {
          info.config = cmd[i + 1];
          break;
        }
        if (cmd[i].rfind("--config=", 0) == 0) {
          info.config = cmd[i].substr(9);
          break;
        }
        if (info.recipe.empty() && !cmd[i].empty() && cmd[i][0] != '-' && cmd[i].find('=') == std::string::npos)
          info.recipe = cmd[i];
      }
    }
  }

  void validate(const RuntimeInfo& info, std::vector<Error>& errors) const override {
    if (info.runtime->framework() != "torchtune" || !info.torchtune_entrypoint()) return;
    const std::string& model = info.model_key;
    const std::string runtime = info.runtime->metadata.name;
    const auto supported = supported_models();
    if (model.empty() || std::find(supported.begin(), supported.end(), model) == supported.end()) {
      std::string list;
      for (const auto& m : supported) list += (list.empty() ? "" : ", ") + m;
      errors.emplace_back("spec.runtimeRef.name",
                          "must have a supported pretrained model, invalid model configured: " +
                              (model.empty() ? runtime + " (a torchtune runtime name is torchtune-<family><version>-<size>)"
                                             : model) +
                              "; supported: " + list);
      return;
    }
    const ConfigSet& set = *info.configs;
    auto has_config = [&](const std::string& suffix) { return set.contains(model + suffix); };
    const std::string from = " (configs: " + set.source() + ")";
    const bool lora = args_enable_lora(info.trainer.args);
    const bool qlora = args_enable_qlora(info.trainer.args);
    const int n = info.num_nodes, p = info.num_proc_per_node;
    const std::string layout = std::to_string(n) + (n == 1 ? " node" : " nodes") + " x " + std::to_string(p) +
                               (p == 1 ? " process" : " processes");

    if (n > 1 && lora) {
      errors.emplace_back("spec.trainer.numNodes",
                          "LoRA fine-tuning is not supported for multi-node training in TorchTune (numNodes " +
                              std::to_string(n) + "); use 1 node with more processes");
    } else if (n > 1 && !has_config("_full_multinode")) {
      errors.emplace_back("spec.trainer.numNodes", "must be 1 for " + model + " model: there is no " + model +
                                                       "_full_multinode config" + from + "; got " + std::to_string(n));
    } else if (qlora && !has_config("_qlora") && !has_config("_qlora_single_device")) {
      errors.emplace_back("spec.runtimeRef.name",
                          "QLoRA is not supported for " + model + " model: no " + model + "_qlora config" + from);
    } else if (qlora && n == 1 && p > 1 && !has_config("_qlora")) {
      errors.emplace_back("spec.trainer.numProcPerNode",
                          "must be 1 for " + model + " model when using QLoRA: only " + model +
                              "_qlora_single_device exists" + from + "; resolved to " + std::to_string(p) + " processes");
      errors.emplace_back("spec.trainer.resourcesPerNode",
                          "must have gpu resource with value 1 for " + model + " model when using QLoRA");
    } else if (qlora && n == 1 && p == 1 && !has_config("_qlora_single_device")) {
      errors.emplace_back("spec.trainer.numProcPerNode",
                          "must be more than 1 for " + model + " model when using QLoRA: only " + model +
                              "_qlora, a distributed config, exists" + from);
    } else if (!info.config.empty() && !set.contains(info.config)) {
      errors.emplace_back("spec.trainer.numProcPerNode",
                          "there is no config " + info.config + " for " + layout + " (recipe " + info.recipe + ")" +
                              from + "; " + model + " has: " + list_configs(set, model));
    }

    for (size_t i = 0; i < info.trainer.args.size(); ++i) {
      const std::string key = key_of(info.trainer.args[i]);
      if (is_runtime_owned(key))
        errors.emplace_back("spec.trainer.args[" + std::to_string(i) + "]",
                            "must not set immutable config \"" + key + "\" in trainer args; it is managed by the runtime " +
                                runtime + " (" + info.trainer.args[i] + ")");
    }
  }

  void mutate(RuntimeInfo& info) const override {
    if (info.runtime->framework() != "torchtune" || !info.torchtune_entrypoint()) return;
    std::vector<std::string> cmd{"tune", "run"};
    if (info.num_nodes > 1 || info.num_proc_per_node > 1) {
      const std::string job = info.job->metadata.name;
      cmd.push_back("--rdzv_endpoint=" + job + "-node-0-0." + job + ":" + std::to_string(kTrainerPort));
    }
    cmd.push_back(info.recipe);
    cmd.push_back("--config");
    cmd.push_back(info.config);
    const std::vector<std::string> runtime_args = runtime_node_args(info);
    for (const std::string& a : runtime_args)
      if (a.find('=') != std::string::npos && is_runtime_owned(key_of(a)) && a[0] != '-') cmd.push_back(a);

    // Runtime dataset defaults, unless the user chose the dataset component.
    std::set<std::string> user_keys;
    std::string user_data_files;
    for (const std::string& a : info.trainer.args) {
      user_keys.insert(key_of(a));
      if (key_of(a) == "dataset.data_files") user_data_files = a.substr(a.find('=') + 1);
    }
    if (!user_keys.count("dataset")) {
      const bool user_location = user_keys.count("dataset.data_dir") || user_keys.count("dataset.data_files");
      for (const std::string& a : runtime_args) {
        if (a.find('=') == std::string::npos || a[0] == '-') continue;
        const std::string key = key_of(a);
        if (key != "dataset" && key.rfind("dataset.", 0) != 0) continue;
        if (user_keys.count(key)) continue;
        if (user_location && (key == "dataset.data_dir" || key == "dataset.data_files")) continue;
        if (key == "dataset.source" && !user_data_files.empty() && !source_of_file(user_data_files).empty()) {
          cmd.push_back("dataset.source=" + source_of_file(user_data_files));
          continue;
        }
        cmd.push_back(a);
      }
    }
    cmd.insert(cmd.end(), info.trainer.args.begin(), info.trainer.args.end());
    info.node_command = cmd;
  }
};

}  // namespace

std::unique_ptr<Plugin> make_torchtune_plugin() { return std::make_unique<TorchTunePlugin>(); }

}  // namespace ktune
