// `ktune plan`: a dry run of distributed fine-tuning's memory and traffic. For a model (a known name
// or a config.json / model directory), a world (--nnodes × --nproc_per_node), a recipe (full or
// LoRA), a dtype and a LoRA rank, it prints what each rank holds in parameters, gradients and AdamW
// state, what it gathers during a step and what it sends per step (train/sharding_plan.h says how).
// With --device cuda it prints instead what the GPU step allocates on each GPU for a batch shape
// (train/gpu_memory_plan.h), with no GPU needed. It loads no weights and starts nothing.
#include <cstdio>
#include <string>
#include <vector>

#include "cli/command_table.h"
#include "cli/flag_args.h"
#include "core/error.h"
#include "train/gpu_memory_plan.h"
#include "train/sharding_plan.h"

namespace ktune::cli {

namespace {

constexpr const char* kUsage =
    "ktune plan --model NAME|config.json|DIR [--nnodes N] [--nproc_per_node N] [--recipe full|lora|RECIPE_NAME] "
    "[--dtype bf16|fp32] [--lora_rank R] [--lora_attn_modules q_proj,v_proj] [--apply_lora_to_mlp] "
    "[--replicate] [--reshard_after_forward true|false] [--gradient_accumulation_steps N] "
    "[--device cpu|cuda [--batch_size B] [--max_seq_len T] [--activation_checkpointing] [--activation_offloading] "
    "[--quantize_base] [--use_dora] [--apply_lora_to_output]]";

// The comma-separated items of a flag's value.
std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> items;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) items.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return items;
}

}  // namespace

int cmd_plan(const Args& args) {
  train::ShardingPlanRequest request;
  train::GpuMemoryPlanRequest gpu;  // --device cuda's own flags (the rest: request's)
  std::string model, device = "cpu";
  std::string gpu_flag;  // the last flag given that only --device cuda takes
  bool fp32_asked = false;
  auto gpu_switch = [&](const std::string& flag) -> bool* {  // --device cuda's switches
    if (flag == "--activation_checkpointing") return &gpu.activation_checkpointing;
    if (flag == "--activation_offloading") return &gpu.activation_offloading;
    if (flag == "--quantize_base") return &gpu.quantize_base;
    if (flag == "--use_dora") return &gpu.use_dora;
    if (flag == "--apply_lora_to_output") return &gpu.apply_lora_to_output;
    return nullptr;
  };
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
      else if (d == "fp32") request.bytes_per_value = 4, fp32_asked = true;
      else throw Error("ktune plan --dtype", "'" + d + "' is neither bf16 nor fp32");
    } else if (a.is("--lora_rank")) request.lora_rank = int(a.int_value(1, kMany));
    else if (a.is("--lora_attn_modules")) request.lora_attn_modules = split_commas(a.value());
    else if (a.is("--apply_lora_to_mlp")) a.expect_no_value(), request.apply_lora_to_mlp = true;
    else if (a.is("--device")) {
      device = a.value();
      if (device != "cpu" && device != "cuda")
        throw Error("ktune plan --device", "'" + device + "' is neither cpu nor cuda");
    } else if (a.is("--batch_size")) gpu_flag = a.arg(), gpu.batch_size = a.int_value(1, kMany);
    else if (a.is("--max_seq_len")) gpu_flag = a.arg(), gpu.max_seq_len = a.int_value(1, kMany);
    else if (bool* on = gpu_switch(a.arg())) gpu_flag = a.arg(), a.expect_no_value(), *on = true;
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
  if (device != "cuda" && !gpu_flag.empty())
    throw Error("ktune plan " + gpu_flag, "plans the GPU step's memory: it needs --device cuda");
  request.model = train::model_config_by_name_or_path(model);
  if (device == "cuda") {
    check(!fp32_asked, "ktune plan --dtype fp32", "the GPU step trains in bf16 only (dtype=bf16, its default)");
    gpu.shared = request;
    std::fputs(train::format_gpu_memory_plan(gpu).c_str(), stdout);
    return 0;
  }
  train::ShardingPlan plan = train::plan_sharding(request);
  std::fputs(train::format_sharding_plan(request, plan).c_str(), stdout);
  return 0;
}

}  // namespace ktune::cli
