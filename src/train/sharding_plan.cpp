#include "train/sharding_plan.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "train/known_models.h"
#include "train/sharded_layout.h"

namespace ktune::train {

namespace {

struct UnitSizes {
  std::vector<int64_t> trainable, frozen;  // element counts of the unit's parameters
};

// A projection in -> out: its weight (and bias) sizes.
struct Projection {
  std::string module;  // torchtune's name: q_proj, k_proj, v_proj, output_proj, gate, up, down
  int64_t in, out;
  bool bias;
};

std::vector<Projection> layer_projections(const model::ModelConfig& c) {
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  return {{"q_proj", C, c.q_dim(), c.qkv_bias},      {"k_proj", C, c.kv_dim(), c.qkv_bias},
          {"v_proj", C, c.kv_dim(), c.qkv_bias},     {"output_proj", c.q_dim(), C, c.o_bias},
          {"gate", C, I, c.mlp_bias},                {"up", C, I, c.mlp_bias},
          {"down", I, C, c.mlp_bias}};
}

// The decoder's parameters, unit by unit (layers, then the root), split trainable / frozen.
std::vector<UnitSizes> unit_sizes(const ShardingPlanRequest& r) {
  const model::ModelConfig& c = r.model;
  std::vector<UnitSizes> units(size_t(c.num_layers) + 1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    UnitSizes& u = units[size_t(l)];
    auto& base = r.lora ? u.frozen : u.trainable;
    for (const Projection& p : layer_projections(c)) {
      base.push_back(p.in * p.out);
      if (p.bias) base.push_back(p.out);
      const bool mlp = p.module == "gate" || p.module == "up" || p.module == "down";
      const bool targeted = mlp ? r.apply_lora_to_mlp
                                : std::find(r.lora_attn_modules.begin(), r.lora_attn_modules.end(), p.module) !=
                                      r.lora_attn_modules.end();
      if (r.lora && targeted) {
        u.trainable.push_back(r.lora_rank * p.in);   // lora_A (r, in)
        u.trainable.push_back(p.out * r.lora_rank);  // lora_B (out, r)
      }
    }
    for (int n = 0; n < (c.sandwich_norms ? 4 : 2); ++n) base.push_back(c.hidden_size);
  }
  UnitSizes& root = units.back();
  auto& base = r.lora ? root.frozen : root.trainable;
  base.push_back(c.vocab_size * c.hidden_size);  // embed_tokens
  base.push_back(c.hidden_size);                 // final norm
  if (!c.tie_word_embeddings) base.push_back(c.vocab_size * c.hidden_size);  // lm_head
  return units;
}

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::string gib(int64_t bytes) {
  char text[96];
  std::snprintf(text, sizeof text, "%10.3f GiB (%lld bytes)", double(bytes) / double(int64_t(1) << 30), (long long)bytes);
  return text;
}

}  // namespace

ShardingPlan plan_sharding(const ShardingPlanRequest& r) {
  check(r.nnodes >= 1, "plan: nnodes", "must be at least 1, not " + std::to_string(r.nnodes));
  check(r.nproc_per_node >= 1, "plan: nproc_per_node", "must be at least 1, not " + std::to_string(r.nproc_per_node));
  check(r.bytes_per_value == 2 || r.bytes_per_value == 4, "plan: dtype", "bytes per value must be 2 (bf16) or 4 (fp32)");
  check(r.gradient_accumulation_steps >= 1, "plan: gradient_accumulation_steps", "must be at least 1");
  check(!r.lora || r.lora_rank >= 1, "plan: lora_rank", "must be at least 1");
  check(r.model.num_layers >= 1 && r.model.hidden_size >= 1, "plan: model", "has no layers");
  for (const std::string& m : r.lora_attn_modules)
    check(m == "q_proj" || m == "k_proj" || m == "v_proj" || m == "output_proj", "plan: lora_attn_modules",
          "'" + m + "' is not one of q_proj, k_proj, v_proj, output_proj");

  ShardingPlan plan;
  const int W = r.nnodes * r.nproc_per_node;
  const int64_t b = r.bytes_per_value;
  plan.world_size = W;
  std::vector<UnitSizes> units = unit_sizes(r);
  // Gathered floats: the root's values (trainable + frozen) and gradients for the whole call; a
  // layer's values from its forward (or, not resharded, from the forward until its backward) and its
  // gradients during its backward.
  int64_t largest_layer = 0, all_layer_values = 0, root = 0, sharded_elements = 0, frozen_shards = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    plan.trainable_params += sum(units[u].trainable);
    plan.frozen_params += sum(units[u].frozen);
    const FlatShardLayout layout = FlatShardLayout::plan(units[u].trainable, W);
    const FlatShardLayout frozen = FlatShardLayout::plan(units[u].frozen, W);
    sharded_elements += layout.shard_size();
    frozen_shards += frozen.shard_size();
    if (u + 1 == units.size()) {
      root = 2 * layout.padded + frozen.padded;
    } else {
      largest_layer = std::max(largest_layer, 2 * layout.padded + frozen.padded);
      all_layer_values += layout.padded + frozen.padded;
    }
    if (r.sharded) {
      // Forward all-gather of every unit; again in the backward for the layers when resharded.
      const int64_t gathers = (u + 1 < units.size() && r.reshard_after_forward) ? 2 : 1;
      plan.all_gather_sent += gathers * (W - 1) * (layout.shard_size() + frozen.shard_size()) * b;
      plan.reduce_scatter_sent += (W - 1) * layout.shard_size() * b;
    }
  }
  plan.total_params = plan.trainable_params + plan.frozen_params;
  plan.checkpoint_model = (r.lora ? plan.frozen_params : plan.total_params) * b;  // LoRA: the base, merged
  plan.checkpoint_adapter = r.lora ? plan.trainable_params * b : 0;
  plan.checkpoint_recipe_state = 3 * plan.trainable_params * b;
  plan.frozen_if_replicated = plan.frozen_params * b;
  plan.frozen = r.sharded ? frozen_shards * b : plan.frozen_if_replicated;
  plan.replicated_persistent = 4 * plan.trainable_params * b;
  if (r.sharded) {
    plan.params = sharded_elements * b;
    plan.gradients = sharded_elements * b;
    plan.optimizer = 2 * sharded_elements * b;
    int64_t largest_layer_grads = 0;
    for (size_t u = 0; u + 1 < units.size(); ++u)
      largest_layer_grads = std::max(largest_layer_grads, FlatShardLayout::plan(units[u].trainable, W).padded);
    plan.gathered_peak = (root + (r.reshard_after_forward ? largest_layer : all_layer_values + largest_layer_grads)) * b;
    plan.all_gather_sent *= r.gradient_accumulation_steps;
    plan.reduce_scatter_sent *= r.gradient_accumulation_steps;
  } else {
    plan.params = plan.trainable_params * b;
    plan.gradients = plan.trainable_params * b;
    plan.optimizer = 2 * plan.trainable_params * b;
    plan.all_reduce_sent = 2 * (W - 1) * plan.trainable_params * b / W;
  }
  return plan;
}

std::string format_sharding_plan(const ShardingPlanRequest& r, const ShardingPlan& p) {
  const model::ModelConfig& c = r.model;
  std::string out;
  char line[512];
  auto add = [&](const std::string& s) { out += s + "\n"; };
  std::snprintf(line, sizeof line, "model: %s, %lld parameters (%lld layers, hidden %lld, intermediate %lld, vocab %lld%s)",
                c.model_type.c_str(), (long long)p.total_params, (long long)c.num_layers, (long long)c.hidden_size,
                (long long)c.intermediate_size, (long long)c.vocab_size, c.tie_word_embeddings ? ", tied embeddings" : "");
  add(line);
  std::string recipe = r.lora ? "lora (rank " + std::to_string(r.lora_rank) + " on " : "full";
  if (r.lora) {
    for (size_t i = 0; i < r.lora_attn_modules.size(); ++i) recipe += (i ? "," : "") + r.lora_attn_modules[i];
    recipe += std::string(r.apply_lora_to_mlp ? ",mlp" : "") + ")";
  }
  std::snprintf(line, sizeof line,
                "world: %d node(s) x %d = %d ranks; recipe %s; dtype %s (%lld bytes per value); %s; "
                "gradient_accumulation_steps=%d",
                r.nnodes, r.nproc_per_node, p.world_size, recipe.c_str(), r.bytes_per_value == 2 ? "bf16" : "fp32",
                (long long)r.bytes_per_value,
                r.sharded ? (std::string("sharded (FSDP), reshard_after_forward=") + (r.reshard_after_forward ? "true" : "false")).c_str()
                          : "replicated (DDP)",
                r.gradient_accumulation_steps);
  add(line);
  std::snprintf(line, sizeof line, "trainable parameters: %lld; frozen: %lld", (long long)p.trainable_params,
                (long long)p.frozen_params);
  add(line);
  add("per rank, between steps:");
  add("  trainable parameters " + gib(p.params));
  add("  gradients            " + gib(p.gradients));
  add("  AdamW state (m, v)   " + gib(p.optimizer));
  if (p.frozen_params > 0)
    add("  frozen base          " + gib(p.frozen) + (r.sharded ? "  sharded; replicated it would be " : "  replicated ") +
        (r.sharded ? gib(p.frozen_if_replicated) : std::string()));
  add("  total                " + gib(p.persistent()));
  std::snprintf(line, sizeof line, "  params+grads+AdamW   %s  = 1/%.2f of the replicated %s",
                gib(p.params + p.gradients + p.optimizer).c_str(),
                double(p.replicated_persistent) / double(std::max<int64_t>(1, p.params + p.gradients + p.optimizer)),
                gib(p.replicated_persistent).c_str());
  add(line);
  add("per rank, gathered at most during a step (values, trainable and frozen, + gradients of the units in flight):");
  add("  gathered             " + gib(p.gathered_peak));
  add("  (activations are not included: they depend on batch_size x seq_len; a run prints its arena)");
  add("per rank, sent per optimizer step (ring algorithms):");
  add("  all-gather           " + gib(p.all_gather_sent));
  add("  reduce-scatter       " + gib(p.reduce_scatter_sent));
  add("  all-reduce           " + gib(p.all_reduce_sent));
  add("  total                " + gib(p.sent()));
  add("on disk, each checkpoint rank 0 writes (tensor data; config and tokenizer files besides):");
  add("  merged model         " + gib(p.checkpoint_model));
  if (r.lora) add("  adapter              " + gib(p.checkpoint_adapter));
  add("  recipe state         " + gib(p.checkpoint_recipe_state) + "  (values, exp_avg, exp_avg_sq)");
  add("  total                " + gib(p.checkpoint_model + p.checkpoint_adapter + p.checkpoint_recipe_state));
  if (p.world_size > 1 && (p.world_size & (p.world_size - 1)) != 0 && r.sharded)
    add("note: on Gloo (CPU), ktune's reduce-scatter for a world size that is not a power of two is an all-reduce "
        "(twice the reduce-scatter traffic)");
  return out;
}

model::ModelConfig model_config_by_name_or_path(const std::string& name) {
  if (std::optional<model::ModelConfig> known = known_model(name)) return *known;
  namespace fs = std::filesystem;
  if (fs::is_directory(name)) return model::ModelConfig::from_file((fs::path(name) / "config.json").string());
  if (fs::is_regular_file(name)) return model::ModelConfig::from_file(name);
  std::string names;
  for (const std::string& k : known_model_names()) names += (names.empty() ? "" : ", ") + k;
  throw Error("plan: --model", "'" + name + "' is neither a known model (" + names +
                                   ", or their Hugging Face names) nor a config.json or model directory");
}

}  // namespace ktune::train
