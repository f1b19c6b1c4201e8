// `ktune plan`: a dry run of distributed fine-tuning's memory and traffic. For a model (a known name
// or a config.json / model directory), a world (--nnodes × --nproc_per_node), a recipe (full or
// LoRA), a dtype and a LoRA rank, it prints what each rank holds in parameters, gradients and AdamW
// state, what it gathers during a step and what it sends per step (train/sharding_plan.h says how).
// It loads no weights and starts nothing.
#include <cstdio>

#include "cli/command_table.h"
#include "core/error.h"
#include "train/sharding_plan.h"

namespace ktune::cli {

namespace {

constexpr const char* kUsage =
    "ktune plan --model NAME|config.json|DIR [--nnodes N] [--nproc_per_node N] [--recipe full|lora|RECIPE_NAME] "
    "[--dtype bf16|fp32] [--lora_rank R] [--lora_attn_modules q_proj,v_proj] [--apply_lora_to_mlp] "
    "[--replicate] [--reshard_after_forward true|false] [--gradient_accumulation_steps N]";

int parse_int(const std::string& flag, const std::string& text) {
  try {
    size_t used = 0;
    int v = std::stoi(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  throw Error("plan: " + flag, "'" + text + "' is not an integer");
}

bool parse_bool(const std::string& flag, const std::string& text) {
  if (text == "true" || text == "True" || text == "1") return true;
  if (text == "false" || text == "False" || text == "0") return false;
  throw Error("plan: " + flag, "'" + text + "' is not true or false");
}

}  // namespace

int cmd_plan(const Args& args) {
  train::ShardingPlanRequest request;
  std::string model;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= args.size()) throw Error("plan: " + a, "needs a value");
      return args[++i];
    };
    if (a == "--model") model = value();
    else if (a == "--nnodes") request.nnodes = parse_int(a, value());
    else if (a == "--nproc_per_node") request.nproc_per_node = parse_int(a, value());
    else if (a == "--recipe") {
      std::string r = value();
      if (r == "full" || r.rfind("full_finetune", 0) == 0) request.lora = false;
      else if (r == "lora" || r.rfind("lora_finetune", 0) == 0) request.lora = true;
      else throw Error("plan: --recipe", "'" + r + "' is neither full nor lora (or a full_/lora_finetune_* recipe)");
    } else if (a == "--dtype") {
      std::string d = value();
      if (d == "bf16") request.bytes_per_value = 2;
      else if (d == "fp32") request.bytes_per_value = 4;
      else throw Error("plan: --dtype", "'" + d + "' is neither bf16 nor fp32");
    } else if (a == "--lora_rank") request.lora_rank = parse_int(a, value());
    else if (a == "--lora_attn_modules") {
      request.lora_attn_modules.clear();
      std::string list = value();
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        if (comma > at) request.lora_attn_modules.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a == "--apply_lora_to_mlp") request.apply_lora_to_mlp = true;
    else if (a == "--replicate") request.sharded = false;
    else if (a == "--reshard_after_forward") request.reshard_after_forward = parse_bool(a, value());
    else if (a == "--gradient_accumulation_steps") request.gradient_accumulation_steps = parse_int(a, value());
    else if (a == "-h" || a == "--help") {
      std::printf("usage: %s\n", kUsage);
      return 0;
    } else
      throw Error("plan", "unknown argument '" + a + "'; usage: " + kUsage);
  }
  if (model.empty()) throw Error("plan", std::string("--model is required; usage: ") + kUsage);
  request.model = train::model_config_by_name_or_path(model);
  train::ShardingPlan plan = train::plan_sharding(request);
  std::fputs(train::format_sharding_plan(request, plan).c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
