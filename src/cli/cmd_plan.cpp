// `ktune plan`: a dry run of distributed fine-tuning's memory and traffic. For a model (a known name
// or a config.json / model directory), a world (--nnodes × --nproc_per_node), a recipe (full or
// LoRA), a dtype and a LoRA rank, it prints what each rank holds in parameters, gradients and AdamW
// state, what it gathers during a step and what it sends per step (train/sharding_plan.h says how).
// It loads no weights and starts nothing.
#include <cstdio>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/sharding_plan.h"

namespace ktune::cli {

namespace {

constexpr const char* kUsage =
    "ktune plan --model NAME|config.json|DIR [--nnodes N] [--nproc_per_node N] [--recipe full|lora|RECIPE_NAME] "
    "[--dtype bf16|fp32] [--lora_rank R] [--lora_attn_modules q_proj,v_proj] [--apply_lora_to_mlp] "
    "[--replicate] [--reshard_after_forward true|false] [--gradient_accumulation_steps N]";

}  // namespace

int cmd_plan(const Args& args) {
  train::ShardingPlanRequest request;
  std::string model;
  FlagArgs a("ktune plan", args);
  constexpr long long kMany = 1 << 20;
  while (a.next()) {
    if (a.is("--model")) model = a.value();
    else if (a.is("--nnodes")) request.nnodes = int(a.int_value(1, kMany));
    else if (a.is("--nproc_per_node")) request.nproc_per_node = int(a.int_value(1, kMany));
    else if (a.is("--recipe")) {
      std::string r = a.value();
      if (r == "full" || r.rfind("full_finetune", 0) == 0) request.lora = false;
      else if (r == "lora" || r.rfind("lora_finetune", 0) == 0) request.lora = true;
      else throw Error("ktune plan --recipe", "'" + r + "' is neither full nor lora (or a full_/lora_finetune_* recipe)");
    } else if (a.is("--dtype")) {
      std::string d = a.value();
      if (d == "bf16") request.bytes_per_value = 2;
      else if (d == "fp32") request.bytes_per_value = 4;
      else throw Error("ktune plan --dtype", "'" + d + "' is neither bf16 nor fp32");
    } else if (a.is("--lora_rank")) request.lora_rank = int(a.int_value(1, kMany));
    else if (a.is("--lora_attn_modules")) {
      request.lora_attn_modules.clear();
      std::string list = a.value();
      for (size_t at = 0; at <= list.size();) {
        size_t comma = list.find(',', at);
        if (comma == std::string::npos) comma = list.size();
        if (comma > at) request.lora_attn_modules.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (a.is("--apply_lora_to_mlp")) a.expect_no_value(), request.apply_lora_to_mlp = true;
    else if (a.is("--replicate")) a.expect_no_value(), request.sharded = false;
    else if (a.is("--reshard_after_forward")) request.reshard_after_forward = a.bool_value();
    else if (a.is("--gradient_accumulation_steps")) request.gradient_accumulation_steps = int(a.int_value(1, kMany));
    else if (a.help()) {
      std::printf("usage: %s\n", kUsage);
      return 0;
    } else
      a.unknown(std::string("usage: ") + kUsage);
  }
  if (model.empty()) throw Error("ktune plan", std::string("--model is required; usage: ") + kUsage);
  request.model = train::model_config_by_name_or_path(model);
  train::ShardingPlan plan = train::plan_sharding(request);
  std::fputs(train::format_sharding_plan(request, plan).c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
