// cuda::Decoder's construction: the parameter table (HF and PEFT names), the gradient units and
// shards, the memory plan and the arenas it sizes, the rotary table; the memory report. The rest of
// the decoder is in the files decoder_impl.h names.
#include "model/cuda/decoder_impl.h"

namespace ktune::cuda {

using namespace decoder_internal;

namespace {

constexpr int64_t kDefaultLossChunkTokens = 512;  // TrainingSetup::ce_chunk_tokens = 0
constexpr int64_t kDefaultHeadBlockRows = 4096;   // TrainingSetup::head_block_rows = 0
constexpr int64_t kDefaultMlpChunkTokens = 2048;  // TrainingSetup::mlp_chunk_tokens = 0

// shard_gradients: whether the whole gradient units 0 (the embedding) and L + 1 (the final norm, the
// head) share one buffer: when the head is untied, so that nothing writes unit 0 before the
// embedding's backward, the last kernel of the backward (decoder.h, TrainingSetup::shard_gradients).
bool whole_units_shared(const DecoderConfig& c) { return !c.tie_word_embeddings; }


std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", double(bytes) / double(1ull << 30));
  return buf;
}


// Refuses a plan larger than the device's free memory less Decoder::kFreeMemoryMargin (cuBLASLt's
// workspace, the rotary table) before any arena is allocated (Decoder::allocate, once sized): what it
// holds, and what would shrink it.
void refuse_if_larger_than_free_memory(const Decoder::MemoryPlan& plan, const TrainingSetup& setup) {
  size_t used = 0, total = 0;
  device_memory_info(&used, &total);
  const size_t free_bytes = total - std::min(used, total);
  if (plan.total() + Decoder::kFreeMemoryMargin <= free_bytes) return;
  std::string shrink;
  auto add = [&](const std::string& what) { shrink += (shrink.empty() ? "" : "; ") + what; };
  if (!setup.activation_checkpointing) add("enable_activation_checkpointing=True");
  if (setup.activation_checkpointing && !setup.activation_offloading) add("enable_activation_offloading=True");
  add("a smaller batch_size or max_seq_len");
  if (setup.full_finetune) add("LoRA instead of a full fine-tune");
  if (!setup.full_finetune && !setup.quantize_base) add("QLoRA (model.quantize_base=True)");
  if (setup.optimizer_shards == 1)
    add("a distributed recipe over several GPUs (it shards the AdamW state and the layers' weights, LoRA's frozen "
        "base included; a full fine-tune's gradients too)");
  throw Error("device=cuda", "the GPU step needs " + gib(plan.total()) + " of device memory (parameters " +
                                 gib(plan.parameters) + ", gradients " + gib(plan.gradients) + ", AdamW state " +
                                 gib(plan.optimizer) + ", activations " + gib(plan.activations) + ") but the GPU has " +
                                 gib(free_bytes) + " free of " + gib(total) + "; to shrink it: " + shrink);
}

}  // namespace

DecoderConfig DecoderConfig::llama3_2_1b() {
  DecoderConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.num_layers = 16;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.intermediate_size = 8192;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 32.0f;
  c.rope_scaling.low_freq_factor = 1.0f;
  c.rope_scaling.high_freq_factor = 4.0f;
  c.rope_scaling.original_max_position_embeddings = 8192;
  c.tie_word_embeddings = true;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Construction: parameters, arenas

Decoder::Decoder(const DecoderConfig& config, const TrainingSetup& setup, uint64_t seed)
    : config_(config), setup_(setup), impl_(std::make_unique<Impl>()) {
  validate();
  check(setup.attention != TrainingSetup::Attention::kAuto, "cuda decoder",
        "TrainingSetup::attention is kAuto: choose the kernel first (model/cuda/attention_choice.h)");
  allocate(true);
  init_parameters(seed);
}

Decoder::Decoder(const DecoderConfig& config, const TrainingSetup& setup, PlanOnly)
    : config_(config), setup_(setup), impl_(std::make_unique<Impl>()) {
  validate();
  allocate(false);
}

Decoder::MemoryPlan Decoder::plan(const DecoderConfig& config, const TrainingSetup& setup) {
  return Decoder(config, setup, PlanOnly{}).memory_plan();
}

void Decoder::validate() const {
  const DecoderConfig& c = config_;
  const TrainingSetup& setup = setup_;
  check(c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0 &&
            c.head_dim > 0 && c.intermediate_size > 0,
        "cuda decoder", "every size of the config must be positive");
  check(c.num_heads % c.num_kv_heads == 0, "cuda decoder", "num_heads must be a multiple of num_kv_heads");
  check(c.head_dim % 2 == 0 && c.head_dim <= 256, "cuda decoder", "head_dim must be even and at most 256");
  check(setup.batch > 0 && setup.seq_len > 0, "cuda decoder", "batch and seq_len must be positive");
  check(c.sliding_window.empty() || int64_t(c.sliding_window.size()) == c.num_layers, "cuda decoder",
        "sliding_window must be empty or hold one window per layer");
  for (int64_t w : c.sliding_window) check(w >= 0, "cuda decoder", "a sliding window must be >= 0 (0: none)");
  check(c.attention_scale >= 0 && c.attn_logit_softcap >= 0 && c.final_logit_softcap >= 0, "cuda decoder",
        "attention_scale and the soft-caps must be >= 0 (0: the default / off)");
  bool any_lora = setup.lora_on_output;
  for (bool on : setup.lora_on) any_lora |= on;
  check(!any_lora || (setup.lora_rank > 0 && setup.lora_alpha > 0), "cuda decoder",
        "LoRA needs lora_rank > 0 and lora_alpha > 0");
  check(setup.full_finetune || any_lora, "cuda decoder", "nothing to train: neither full_finetune nor LoRA");
  check(!setup.quantize_base || (any_lora && !setup.full_finetune), "cuda decoder",
        "quantize_base (QLoRA) needs LoRA and a frozen base (no full_finetune)");
  check(!setup.quantize_unadapted || setup.quantize_base, "cuda decoder", "quantize_unadapted needs quantize_base");
  check(setup.lora_dropout >= 0.0f && setup.lora_dropout < 1.0f, "cuda decoder", "lora_dropout must be in [0, 1)");
  check(!setup.use_dora || (any_lora && !setup.full_finetune), "cuda decoder",
        "use_dora (DoRA) needs LoRA and a frozen base (no full_finetune)");
  // The CPU engine's refusal (model::attach_lora), as torchtune's.
  check(!setup.lora_on_output || !c.tie_word_embeddings, "cuda decoder: lora_on_output",
        "this model ties its output layer to the embeddings (tie_word_embeddings), so there is no separate output "
        "projection for LoRA");
  check(setup.head_block_rows >= 0, "cuda decoder", "head_block_rows must be >= 0 (0: the default)");
  check(!setup.activation_offloading || setup.activation_checkpointing, "cuda decoder",
        "activation_offloading offloads the layer inputs that activation_checkpointing keeps: it needs "
        "activation_checkpointing");
  check(setup.optimizer_shards >= 1 && setup.optimizer_shard >= 0 && setup.optimizer_shard < setup.optimizer_shards,
        "cuda decoder", "optimizer_shard must be in [0, optimizer_shards) and optimizer_shards >= 1, got shard " +
                            std::to_string(setup.optimizer_shard) + " of " + std::to_string(setup.optimizer_shards));
  check(!setup.shard_gradients || (setup.optimizer_shards > 1 && setup.full_finetune && !any_lora), "cuda decoder",
        "shard_gradients (ZeRO-2) needs a full fine-tune without LoRA over optimizer_shards > 1");
  check(!setup.shard_weights || (setup.optimizer_shards > 1 && (!setup.full_finetune || setup.shard_gradients)),
        "cuda decoder",
        "shard_weights (ZeRO-3) needs optimizer_shards > 1, and a full fine-tune shards the weights in the gradient "
        "units' layout: shard_gradients");
}

Decoder::~Decoder() = default;

// What allocate() works out, phase by phase, before (or instead of) carving the arenas.
struct Decoder::Layout {
  // Per parameter (params_'s order):
  std::vector<bool> trainable;
  std::vector<bool> nf4;                  // QLoRA: held as NF4 codes and scales
  std::vector<int64_t> unit_of;           // its gradient unit (shard_gradients: 0, 1 + layer, L + 1)
  std::vector<int64_t> layer_of;          // the layer a base parameter belongs to (-1: none, or a LoRA matrix)
  std::vector<int64_t> offset_in_unit;    // its gradient's first element in its unit
  std::vector<int64_t> weight_offset;     // shard_weights: its place in its layer's weight unit (-1: whole)
  std::vector<int64_t> nf4_scales_offset;  // and an NF4 one's scales'
  int64_t nf4_largest = 0;                // the largest NF4 weight dequantised through the scratch (elements)
  size_t grad_slot_bytes = 0;             // shard_gradients: each of the two layer gradient slots
  size_t weight_slot_bytes = 0;           // shard_weights: each weight slot
  int weight_slots = 1;
  bool layer_weight_sharded(size_t i) const { return weight_offset[i] >= 0; }
};

// What the activation layout needs besides the config and the setup (Impl::lay_out_activations).
struct Decoder::Impl::ActivationNeeds {
  int64_t lora_in_largest = 0;       // the widest input an adapter reads (LoRA dropout's scratch rows)
  int64_t dora_weight_largest = 0;   // DoRA's W + s B A scratch (lm_head's: a block of head_rows rows)
  int64_t dora_out_largest = 0;
  int64_t nf4_largest = 0;           // Layout::nf4_largest
  bool head_nf4 = false;             // QLoRA on lm_head
  bool head_dora = false, head_dora_dropout = false;
  bool any_bias_grad = false;        // a trainable bias: the ones vector
  bool any_gemm_attention = false, any_flash_attention = false, any_tc_attention = false;
  AttentionShape attention{};        // the planned step's, for the attention kernels' scratch
  // Outputs of the layout: activation offloading's device slots, the loss's phase scratch bytes and
  // how many of them lie over buffers the loss leaves idle (the loss block).
  std::vector<bf16_t*> offload_slots;
  size_t loss_bytes = 0, loss_overlaid = 0;
};

void Decoder::allocate(bool on_device) {
  Impl& s = *impl_;
  const int64_t r = setup_.lora_rank;
  s.lora_scale = r > 0 ? setup_.lora_alpha / float(r) : 0.0f;
  s.lora_rank = r;
  s.params = &params_;
  s.dropout_p = setup_.lora_dropout;
  s.lora_seed = setup_.lora_seed;
  s.checkpointing = setup_.activation_checkpointing;
  s.nf4_fused = setup_.nf4_fused_gemm;
  s.offloading = setup_.activation_offloading;

  Layout lay;
  declare_parameters(lay);
  choose_nf4(lay);
  const size_t gbytes = lay_out_gradients(lay);
  const size_t obytes = 2 * aligned(size_t(shard_.size) * 2);
  size_t nf4_bytes = 0;
  const size_t pbytes = lay_out_parameters(lay, &nf4_bytes);
  Impl::ActivationNeeds needs = s.plan_step(config_, setup_, lay.nf4_largest, lay.nf4, lay.trainable);
  Carver count;
  s.lay_out_activations(config_, setup_, needs, count);

  plan_bytes_.parameters = pbytes;
  plan_bytes_.nf4_base = nf4_bytes;
  plan_bytes_.nf4_scratch = lay.nf4_largest > 0 ? aligned(size_t(lay.nf4_largest) * 2) : 0;
  plan_bytes_.gradients = gbytes;
  plan_bytes_.optimizer = obytes;
  plan_bytes_.activations = count.bytes;
  plan_bytes_.loss_scratch = needs.loss_bytes;
  plan_bytes_.loss_overlaid = needs.loss_overlaid;
  plan_bytes_.host_offload =
      s.offloading ? ActivationOffload::host_bytes(config_.num_layers + 1, s.N * config_.hidden_size) : 0;
  if (!on_device) return;
  // Sized: refused here when larger than the device, before any arena is allocated.
  refuse_if_larger_than_free_memory(plan_bytes_, setup_);
  s.index_flag = std::make_unique<IndexFlag>();
  s.loss_totals_at = DeviceBuffer(linear_cross_entropy_totals_bytes());
  s.param_arena = std::make_unique<DeviceArena>("cuda decoder parameters", pbytes);
  s.grad_arena = std::make_unique<DeviceArena>("cuda decoder gradients", gbytes);
  s.optim_arena = std::make_unique<DeviceArena>("cuda decoder AdamW state", obytes);
  shard_.m = s.optim_arena->allocate_n<bf16_t>(size_t(shard_.size));
  shard_.v = s.optim_arena->allocate_n<bf16_t>(size_t(shard_.size));
  allocate_gradients(lay);
  if (setup_.shard_weights) allocate_weight_slots(lay);
  place_parameters(lay);
  s.act_arena = std::make_unique<DeviceArena>("cuda decoder activations", count.bytes);
  Carver carve{s.act_arena.get()};
  s.lay_out_activations(config_, setup_, needs, carve);
  const int64_t C = config_.hidden_size;
  if (s.offloading) s.offload.init(config_.num_layers + 1, s.N * C, needs.offload_slots);
  if (s.ones) fill_bf16(s.ones, s.N, 1.0f);
  // Gemma: sqrt(hidden) in the weights' dtype (bf16), as HF's embed_scale.to(weight.dtype).
  s.embed_scale = config_.scale_embeddings ? bf16_to_f32(f32_to_bf16(float(std::sqrt(double(C))))) : 1.0f;

  // Positions are laid out by the first step (upload_batch); the rotary table for T_max positions
  // (the CPU RopeTable's angles).
  s.positions_T = s.positions_B = 0;
  s.set_step_shape(s.B_max, s.T_max);
  s.build_rope_table(config_, s.T);
}

// Parameter metadata in HF order, then the LoRA matrices in PEFT's names: params_, each one's unit,
// layer and trainability, and the Impl's layers and output projection that index them.
void Decoder::declare_parameters(Layout& lay) {
  const DecoderConfig& c = config_;
  Impl& s = *impl_;
  const int64_t C = c.hidden_size, I = c.intermediate_size, QD = c.num_heads * c.head_dim,
                KD = c.num_kv_heads * c.head_dim, L = c.num_layers, V = c.vocab_size, r = setup_.lora_rank;
  int64_t unit = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool train) {
    DeviceParameter p;
    p.name = name;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    params_.push_back(std::move(p));
    lay.trainable.push_back(train);
    lay.unit_of.push_back(setup_.shard_gradients ? unit : 0);
    lay.layer_of.push_back(unit >= 1 && unit <= L ? unit - 1 : -1);  // the LoRA matrices come after unit L + 1's
    return int(params_.size() - 1);
  };
  const bool full = setup_.full_finetune;
  s.embed = add("model.embed_tokens.weight", {V, C}, full);
  s.layers.resize(size_t(L));
  const int64_t dims[kNumProjections][2] = {{C, QD}, {C, KD}, {C, KD}, {QD, C}, {C, I}, {C, I}, {I, C}};  // in, out
  for (int64_t l = 0; l < L; ++l) {
    Impl::Layer& layer = s.layers[size_t(l)];
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    unit = 1 + l;
    for (int p = 0; p < kNumProjections; ++p) {
      const std::string module = pre + (p <= kO ? "self_attn." : "mlp.") + projection_name(p);
      layer.proj[p].module = module;
      layer.proj[p].in = dims[p][0];
      layer.proj[p].out = dims[p][1];
      layer.proj[p].weight = add(module + ".weight", {dims[p][1], dims[p][0]}, full);
      const bool biased = (c.qkv_bias && p <= kV) || (c.o_bias && p == kO) || (c.mlp_bias && p >= kGate);
      if (biased) layer.proj[p].bias = add(module + ".bias", {dims[p][1]}, full);
    }
    layer.norm_attn = add(pre + "input_layernorm.weight", {C}, full);
    if (c.sandwich_norms) {
      layer.norm_attn_out = add(pre + "post_attention_layernorm.weight", {C}, full);
      layer.norm_mlp = add(pre + "pre_feedforward_layernorm.weight", {C}, full);
      layer.norm_mlp_out = add(pre + "post_feedforward_layernorm.weight", {C}, full);
    } else {
      layer.norm_mlp = add(pre + "post_attention_layernorm.weight", {C}, full);
    }
  }
  unit = L + 1;
  s.final_norm = add("model.norm.weight", {C}, full);
  s.head = c.tie_word_embeddings ? s.embed : add("lm_head.weight", {V, C}, full);
  s.output.in = C, s.output.out = V, s.output.weight = s.head, s.output.module = "lm_head";
  if (r == 0) return;
  for (int64_t l = 0; l < L; ++l) {
    const std::string pre = "base_model.model.model.layers." + std::to_string(l) + ".";
    for (int p = 0; p < kNumProjections; ++p) {
      if (!setup_.lora_on[p]) continue;
      Impl::Linear& lin = s.layers[size_t(l)].proj[p];
      const std::string module = pre + (p <= kO ? "self_attn." : "mlp.") + projection_name(p);
      lin.lora_a = add(module + ".lora_A.weight", {r, lin.in}, true);
      lin.lora_b = add(module + ".lora_B.weight", {lin.out, r}, true);
      if (setup_.use_dora) lin.magnitude = add(module + ".lora_magnitude_vector", {lin.out}, true);
    }
  }
  if (setup_.lora_on_output) {  // the CPU adapter's names: "base_model.model." + "lm_head"
    s.output.lora_a = add("base_model.model.lm_head.lora_A.weight", {r, C}, true);
    s.output.lora_b = add("base_model.model.lm_head.lora_B.weight", {V, r}, true);
    if (setup_.use_dora) s.output.magnitude = add("base_model.model.lm_head.lora_magnitude_vector", {V}, true);
  }
}

// QLoRA: the base weights of the adapted projections in NF4 (codes + scales instead of bf16 values),
// and with quantize_unadapted those of the layers' other projections. lm_head's (adapted only) is
// dequantised a block of head_rows vocabulary rows at a time (the fused loss, DoRA's norms).
void Decoder::choose_nf4(Layout& lay) {
  Impl& s = *impl_;
  const int64_t C = config_.hidden_size, V = config_.vocab_size;
  s.head_rows = std::min(V, setup_.head_block_rows > 0 ? setup_.head_block_rows : kDefaultHeadBlockRows);
  lay.nf4.assign(params_.size(), false);
  if (!setup_.quantize_base) return;
  std::vector<const Impl::Linear*> quantized = {&s.output};  // lm_head's W too when it carries LoRA
  for (const Impl::Layer& layer : s.layers)
    for (const Impl::Linear& lin : layer.proj) quantized.push_back(&lin);
  for (const Impl::Linear* lin : quantized) {
    if (lin->lora_a < 0 && (lin == &s.output || !setup_.quantize_unadapted)) continue;
    const DeviceParameter& w = params_[size_t(lin->weight)];
    check(w.numel % cpu::kNf4BlockSize == 0, "cuda decoder: parameter " + w.name,
          "QLoRA needs out*in divisible by 64 (NF4 blocks), got " + std::to_string(w.numel));
    lay.nf4[size_t(lin->weight)] = true;
    // Through the scratch unless the fused GEMM takes it (a layer's projection without DoRA);
    // lm_head's a block of head_rows vocabulary rows at a time.
    const bool fused =
        lin != &s.output && nf4_gemm_fused(setup_.nf4_fused_gemm, lin->magnitude >= 0, w.shape[0], w.shape[1]);
    if (!fused) lay.nf4_largest = std::max(lay.nf4_largest, lin == &s.output ? s.head_rows * C : w.numel);
  }
  check(s.output.lora_a < 0 || s.head_rows * C % cpu::kNf4BlockSize == 0, "cuda decoder: lm_head",
        "QLoRA dequantises lm_head in blocks of head_block_rows rows: rows * hidden_size must be a multiple of 64, "
        "got " + std::to_string(s.head_rows) + " * " + std::to_string(C));
}

// The gradient units (one, the whole buffer, without shard_gradients): each parameter's gradient at
// an aligned offset in its unit, each unit padded to whole shards of 64-float multiples; this rank's
// shard of them. Returns the gradient arena's bytes: the one buffer (the shard a slice of it), or the
// shard's accumulators, units 0 and L + 1 whole (one buffer between them: whole_units_shared) and
// the two layer slots (each the largest layer unit).
size_t Decoder::lay_out_gradients(Layout& lay) {
  const int64_t L = config_.num_layers, shards = setup_.optimizer_shards, rank = setup_.optimizer_shard;
  const int64_t n_units = setup_.shard_gradients ? L + 2 : 1;
  std::vector<int64_t> unit_floats(size_t(n_units), 0);
  lay.offset_in_unit.assign(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!lay.trainable[i]) continue;
    lay.offset_in_unit[i] = unit_floats[size_t(lay.unit_of[i])];
    unit_floats[size_t(lay.unit_of[i])] += int64_t(aligned(size_t(params_[i].numel) * 4) / 4);
  }
  units_.assign(size_t(n_units), GradientUnit{});
  shard_ = OptimizerShard{};
  for (int64_t u = 0, begin = 0; u < n_units; ++u) {
    GradientUnit& unit_u = units_[size_t(u)];
    unit_u.begin = begin;
    unit_u.size = ceil_div(unit_floats[size_t(u)], shards * kShardMultiple) * shards * kShardMultiple;
    unit_u.piece = unit_u.size / shards;
    unit_u.shard_offset = shard_.size;
    shard_.size += unit_u.piece;
    begin += unit_u.size;
  }
  if (!setup_.shard_gradients) {
    shard_.begin = rank * units_[0].piece;
    return size_t(units_[0].size) * 4;
  }
  plan_bytes_.grad_accumulators = aligned(size_t(shard_.size) * 4);
  const size_t embedding_unit = aligned(size_t(units_[0].size) * 4),
               top_unit = aligned(size_t(units_[size_t(L + 1)].size) * 4);
  plan_bytes_.grad_whole_units =
      whole_units_shared(config_) ? std::max(embedding_unit, top_unit) : embedding_unit + top_unit;
  for (int64_t l = 0; l < L; ++l)
    lay.grad_slot_bytes = std::max(lay.grad_slot_bytes, aligned(size_t(units_[size_t(1 + l)].size) * 4));
  plan_bytes_.grad_layer_slots = Impl::kGradSlots * lay.grad_slot_bytes;
  return plan_bytes_.grad_accumulators + plan_bytes_.grad_whole_units + plan_bytes_.grad_layer_slots;
}

// The parameters: each whole (bf16, or NF4 codes and scales), except with shard_weights the layers'
// sharded ones: this rank's piece of each layer's weight unit and the two weight slots, each as large
// as the largest unit (one holds the layer that computes, the other takes the next layer's gather).
// QLoRA's layer NF4 codes and scales are in the units like the bf16 weights; lm_head's stay whole.
// Returns the parameter arena's bytes (*nf4_bytes: of them, the NF4 held whole).
size_t Decoder::lay_out_parameters(Layout& lay, size_t* nf4_bytes) {
  lay.weight_offset =
      weight_unit_layout(lay.layer_of, lay.trainable, lay.nf4, lay.offset_in_unit, &lay.nf4_scales_offset);
  size_t pbytes = 0;
  *nf4_bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t n = size_t(params_[i].numel);
    if (lay.layer_weight_sharded(i)) continue;
    if (lay.nf4[i]) *nf4_bytes += aligned(n / 2) + aligned(n / size_t(cpu::kNf4BlockSize) * sizeof(bf16_t));
    else pbytes += aligned(n * 2);
  }
  pbytes += *nf4_bytes;
  for (const WeightUnit& unit_l : weight_units_) {
    plan_bytes_.weight_pieces += aligned(size_t(unit_l.piece) * 2);
    lay.weight_slot_bytes = std::max(lay.weight_slot_bytes, aligned(size_t(unit_l.size) * 2));
  }
  lay.weight_slots = setup_.prefetch_weights ? Impl::kWeightSlots : 1;  // one: no prefetch
  plan_bytes_.weight_slots = size_t(lay.weight_slots) * lay.weight_slot_bytes;
  return pbytes + plan_bytes_.weight_pieces + plan_bytes_.weight_slots;
}

// The gradient arena carved: the one buffer, or (shard_gradients) the shard's accumulators, the whole
// units (one buffer between them under an untied head) and the two layer slots, with the reduce
// channels' events.
void Decoder::allocate_gradients(const Layout& lay) {
  Impl& s = *impl_;
  const int64_t L = config_.num_layers;
  if (!setup_.shard_gradients) {
    units_[0].grads = s.grad_arena->allocate_n<float>(size_t(units_[0].size));
    shard_.grad = units_[0].grads + shard_.begin;
    return;
  }
  shard_.grad = s.grad_arena->allocate_n<float>(size_t(shard_.size));
  s.whole_units_shared = whole_units_shared(config_);
  GradientUnit &embedding = units_[0], &top = units_[size_t(L + 1)];
  if (s.whole_units_shared) {
    embedding.grads = s.grad_arena->allocate_n<float>(size_t(std::max(embedding.size, top.size)));
    top.grads = embedding.grads;
  } else {
    embedding.grads = s.grad_arena->allocate_n<float>(size_t(embedding.size));
    top.grads = s.grad_arena->allocate_n<float>(size_t(top.size));
  }
  s.grad_slot_bytes = lay.grad_slot_bytes;
  for (int k = 0; k < Impl::kGradSlots; ++k)
    s.grad_slot[k] = static_cast<float*>(s.grad_arena->allocate(s.grad_slot_bytes));
  for (int64_t l = 0; l < L; ++l) units_[size_t(1 + l)].grads = s.grad_slot[l % Impl::kGradSlots];
  for (int k = 0; k < Impl::kReduceChannels; ++k) {
    KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&s.grad_ready[k], cudaEventDisableTiming));
    KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&s.grad_reduced[k], cudaEventDisableTiming));
  }
  s.grad_units = &units_;
  s.gradient_reduce = &gradient_reduce_;
  s.grad_accumulator = shard_.grad;
  s.grad_shard = setup_.optimizer_shard;
}

// shard_weights: the weight slots (with their events) and this rank's pieces of the layers' weight
// units, zeroed (the gaps and the padding between parameters stay 0).
void Decoder::allocate_weight_slots(const Layout& lay) {
  Impl& s = *impl_;
  s.weight_slots = lay.weight_slots;
  for (int k = 0; k < s.weight_slots; ++k) {
    s.weight_slot[k] = static_cast<bf16_t*>(s.param_arena->allocate(lay.weight_slot_bytes));
    KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&s.slot_ready[k], cudaEventDisableTiming));
    KTUNE_CUDA_CHECK(cudaEventCreateWithFlags(&s.slot_gathered[k], cudaEventDisableTiming));
  }
  for (WeightUnit& unit_l : weight_units_) {
    unit_l.piece_values = s.param_arena->allocate_n<bf16_t>(size_t(unit_l.piece));
    KTUNE_CUDA_CHECK(cudaMemsetAsync(unit_l.piece_values, 0, size_t(unit_l.piece) * 2, nullptr));
  }
  s.weight_units = &weight_units_;
  s.weight_gather = &weight_gather_;
  s.weight_shard = setup_.optimizer_shard;
}

// Each parameter's storage (its value, or NF4 codes and scales: whole in the parameter arena, or in
// its layer's slot at its place in the weight unit) and, trainable, its gradient and its share of
// this rank's shard (moments, accumulator, the value it updates).
void Decoder::place_parameters(const Layout& lay) {
  Impl& s = *impl_;
  const int64_t rank = setup_.optimizer_shard;
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    if (lay.layer_weight_sharded(i)) {  // in its layer's slot, at its place in the layer's weight unit
      p.weight_layer = lay.layer_of[i];
      p.weight_offset = lay.weight_offset[i];
      bf16_t* slot = s.weight_slot[s.slot_of(p.weight_layer)];
      if (lay.nf4[i]) {  // the codes' and the scales' bytes at their places (256-byte aligned)
        p.nf4_scales_offset = lay.nf4_scales_offset[i];
        p.nf4_codes = reinterpret_cast<uint8_t*>(slot + p.weight_offset);
        p.nf4_scales = slot + p.nf4_scales_offset;
      } else {
        p.value = slot + p.weight_offset;
      }
    } else if (lay.nf4[i]) {
      p.nf4_codes = s.param_arena->allocate_n<uint8_t>(size_t(p.numel / 2));
      p.nf4_scales = s.param_arena->allocate_n<bf16_t>(size_t(p.numel / cpu::kNf4BlockSize));
    } else {
      p.value = s.param_arena->allocate_n<bf16_t>(size_t(p.numel));
    }
    if (!lay.trainable[i]) continue;
    // This rank's piece of the unit: layout elements [piece_begin, piece_begin + piece), at
    // unit.shard_offset in the shard's accumulator and moments.
    const GradientUnit& unit_p = units_[size_t(lay.unit_of[i])];
    const int64_t piece_begin = unit_p.begin + rank * unit_p.piece;
    p.unit = lay.unit_of[i];
    p.grad = unit_p.grads + lay.offset_in_unit[i];
    p.grad_offset = unit_p.begin + lay.offset_in_unit[i];
    p.shard_begin = std::clamp<int64_t>(piece_begin - p.grad_offset, 0, p.numel);
    p.shard_end = std::clamp<int64_t>(piece_begin + unit_p.piece - p.grad_offset, 0, p.numel);
    if (p.shard_begin >= p.shard_end) continue;
    const int64_t k = unit_p.shard_offset + (p.grad_offset + p.shard_begin - piece_begin);
    p.m = shard_.m + k;
    p.v = shard_.v + k;
    p.shard_grad = shard_.grad + k;
    // A full fine-tune's weight unit is its gradient unit's layout: the same piece.
    p.shard_value = lay.layer_weight_sharded(i) ? piece_value(p.weight_layer, p.weight_offset + p.shard_begin)
                                                : p.value + p.shard_begin;
  }
}

// The planned step's shape (B_max x T_max, the MLP's chunk, the loss's chunk), each layer's attention
// kernel and shape, and what the activation layout needs to size its scratch.
Decoder::Impl::ActivationNeeds Decoder::Impl::plan_step(const DecoderConfig& c, const TrainingSetup& setup,
                                                        int64_t nf4_largest_weight, const std::vector<bool>& nf4,
                                                        const std::vector<bool>& trainable) {
  const int64_t C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  B = B_max = setup.batch;
  T = T_max = setup.seq_len;
  N = B * T;
  mlp_chunked = setup.activation_checkpointing;
  mlp_rows = mlp_chunked ? std::min(N, setup.mlp_chunk_tokens > 0 ? setup.mlp_chunk_tokens : kDefaultMlpChunkTokens)
                         : N;
  ce_chunk = setup.ce_chunk_tokens > 0 ? setup.ce_chunk_tokens : kDefaultLossChunkTokens;
  if (ce_chunk > 128) ce_chunk = ce_chunk / 128 * 128;
  ce_chunk = std::min(ce_chunk, N);
  ActivationNeeds needs;
  needs.nf4_largest = nf4_largest_weight;
  needs.head_dora = output.magnitude >= 0;  // DoRA on lm_head
  needs.head_dora_dropout = needs.head_dora && setup.lora_dropout > 0;
  ce_scratch_bytes = linear_cross_entropy_scratch_bytes(ce_chunk, V, needs.head_dora_dropout);
  needs.attention = AttentionShape{B, T, c.num_heads, c.num_kv_heads, c.head_dim, 1.0f, 0, 0.0f};
  // Each layer's attention: a window reaching back over the whole row (>= T) masks nothing and is
  // dropped; what remains of a window, and a soft-cap, run on whichever path the layer takes (the
  // fused tensor-core kernel has both; kTensorCore falls back to kGemm only for a head_dim it lacks).
  const float attention_scale = c.attention_scale > 0 ? c.attention_scale : 1.0f / std::sqrt(float(c.head_dim));
  for (int64_t l = 0; l < L; ++l) {
    Layer& layer = layers[size_t(l)];
    const int64_t window = c.window(l) >= T ? 0 : c.window(l);
    layer.attention =
        AttentionShape{B, T, c.num_heads, c.num_kv_heads, c.head_dim, attention_scale, window, c.attn_logit_softcap};
    using A = TrainingSetup::Attention;
    layer.kernel = setup.attention == A::kFlash ? A::kFlash : A::kGemm;
    if (setup.attention == A::kTensorCore && flash_attention_tc_supports(layer.attention))
      layer.kernel = A::kTensorCore;
    needs.any_gemm_attention |= layer.kernel == A::kGemm;
    needs.any_flash_attention |= layer.kernel == A::kFlash;
    needs.any_tc_attention |= layer.kernel == A::kTensorCore;
  }
  needs.lora_in_largest = output.lora_a >= 0 ? C : 0;  // lm_head's input is C wide
  needs.head_nf4 = output.lora_a >= 0 && nf4[size_t(output.weight)];
  needs.dora_weight_largest = needs.head_dora ? head_rows * C : 0;
  for (const Layer& layer : layers)
    for (const Linear& lin : layer.proj) {
      if (lin.lora_a >= 0) needs.lora_in_largest = std::max(needs.lora_in_largest, lin.in);
      if (lin.magnitude >= 0) {
        needs.dora_weight_largest = std::max(needs.dora_weight_largest, lin.in * lin.out);
        needs.dora_out_largest = std::max(needs.dora_out_largest, lin.out);
      }
      needs.any_bias_grad |= lin.bias >= 0 && trainable[size_t(lin.bias)];
    }
  return needs;
}

// The activation arena's layout, run once to count (k without an arena) and once to carve: the
// residual stream (in offloading's slots), the batch, the backward's buffers, the loss block (each
// layer's saved activations, or with checkpointing the one layer's all share, and the attention
// gradients, the loss's scratch over them) and one phase-scratch region.
void Decoder::Impl::lay_out_activations(const DecoderConfig& c, const TrainingSetup& setup, ActivationNeeds& needs,
                                        Carver& k) {
  const int64_t C = c.hidden_size, QD = c.num_heads * c.head_dim, KD = c.num_kv_heads * c.head_dim,
                L = c.num_layers, V = c.vocab_size, r = lora_rank;
  resid.assign(size_t(L + 1), nullptr);
  if (offloading) {  // the L + 1 share the two slots: resid[j] in slot j % kSlots
    needs.offload_slots.assign(size_t(ActivationOffload::slot_count(L + 1)), nullptr);
    for (auto& x : needs.offload_slots) x = k.take<bf16_t>(N * C);
    for (int64_t j = 0; j <= L; ++j) resid[size_t(j)] = needs.offload_slots[size_t(j % ActivationOffload::kSlots)];
  } else {
    for (auto& x : resid) x = k.take<bf16_t>(N * C);
  }
  final_rstd = k.take<float>(N);
  tokens = k.take<int32_t>(N);
  labels = k.take<int32_t>(N);
  positions = k.take<int32_t>(N);
  doc_ids = k.take<int32_t>(N);
  doc_first_key = k.take<int32_t>(N);
  doc_last_query = k.take<int32_t>(N);
  // dres and dln back to back, (N, C) bf16 each: the loss's f32 (N, C) gradient before them
  // (the backward's first kernel reads it into dtmp; dres and dln are written after).
  dnormed = k.take<float>(N * C);
  dres = reinterpret_cast<bf16_t*>(dnormed);
  dln = dres + N * C;
  dtmp = k.take<bf16_t>(N * C);
  final_normed = dtmp;  // the loss reads it; the backward writes dtmp only after the loss
  lora_g = r > 0 ? k.take<bf16_t>(N * r) : nullptr;
  head_xa = output.lora_a >= 0 ? k.take<bf16_t>(N * r) : nullptr;
  output.dora_norm = needs.head_dora ? k.take<float>(V) : nullptr;  // (V) from before the loss to its end
  output.dora_scale = needs.head_dora ? k.take<float>(V) : nullptr;
  ones = needs.any_bias_grad ? k.take<bf16_t>(N) : nullptr;
  // Phase scratch: the fused loss's chunk (used by the loss, between the forward and the backward;
  // with QLoRA on lm_head also a block of the head's W dequantised, with DoRA on lm_head and dropout
  // x' and its gradient, all read during the loss), the attention kernels' (inside one layer's
  // attention) and the projections' (inside one linear_forward / linear_backward: the NF4 weight
  // dequantised, LoRA dropout's x', DoRA's; LoRA on lm_head uses x' just before the fused loss and
  // just after it, never during it, and DoRA's norms of lm_head just before it). One stream runs them
  // one after another and none reads what another phase left. Sizes first.
  Overlay loss, attention, projection;
  lay_out_phase_scratch(c, setup, needs, loss, attention, projection);
  needs.loss_bytes = loss.bytes;
  // The loss block: buffers the loss leaves idle, back to back, with the loss's scratch laid over
  // them (grown to its size where they are smaller): the backward's attention gradients (written
  // first by the last layer's backward, after the loss) and, with checkpointing, the one layer's
  // activations every layer shares (the backward runs each layer's forward again into them, the
  // last layer's too, before reading them).
  const size_t block_start = k.bytes;
  lay_out_layer_activations(c, k);
  const size_t attention_grads_start = k.bytes;
  datt = k.take<bf16_t>(N * QD);
  dq = k.take<bf16_t>(N * QD);
  dk = k.take<bf16_t>(N * KD);
  dv = k.take<bf16_t>(N * KD);
  char* loss_base = checkpointing ? reinterpret_cast<char*>(acts[0].ln1) : reinterpret_cast<char*>(datt);
  const size_t idle = k.bytes - (checkpointing ? block_start : attention_grads_start);
  if (loss.bytes > idle) k.take<char>(int64_t(loss.bytes - idle));
  needs.loss_overlaid = std::min(loss.bytes, idle);
  // The attention kernels' and the projections' scratch overlay one region, as large as the larger.
  char* phase = k.take<char>(int64_t(std::max(attention.bytes, projection.bytes)));
  Overlay loss_at{loss_base}, attention_at{phase}, projection_at{phase};
  lay_out_phase_scratch(c, setup, needs, loss_at, attention_at, projection_at);
}

// Every layer's saved activations; with activation checkpointing, one layer's that all share (each
// layer's forward is run again into them before its backward), the residual stream being what is
// kept per layer.
void Decoder::Impl::lay_out_layer_activations(const DecoderConfig& c, Carver& k) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, QD = c.num_heads * c.head_dim,
                KD = c.num_kv_heads * c.head_dim, L = c.num_layers, r = lora_rank;
  acts.assign(size_t(L), Acts{});
  for (int64_t l = 0; l < L; ++l) {
    Acts& a = acts[size_t(l)];
    if (checkpointing && l > 0) {
      a = acts[0];
      for (int p = 0; p < kNumProjections; ++p) {
        const Linear& first = layers[0].proj[p];
        Linear& lin = layers[size_t(l)].proj[p];
        lin.dora_pre = first.dora_pre, lin.dora_norm = first.dora_norm, lin.dora_scale = first.dora_scale;
      }
      continue;
    }
    a.ln1 = k.take<bf16_t>(N * C);
    a.rstd1 = k.take<float>(N);
    a.q = k.take<bf16_t>(N * QD);
    a.k = k.take<bf16_t>(N * KD);
    a.v = k.take<bf16_t>(N * KD);
    a.att = k.take<bf16_t>(N * QD);
    a.lse = k.take<float>(N * c.num_heads);
    a.x_mid = k.take<bf16_t>(N * C);
    a.ln2 = k.take<bf16_t>(N * C);
    a.rstd2 = k.take<float>(N);
    a.gate = k.take<bf16_t>(mlp_rows * I);  // (mlp_rows, I): all N rows unless checkpointing chunks them
    a.up = k.take<bf16_t>(mlp_rows * I);
    a.act = k.take<bf16_t>(mlp_rows * I);
    for (int p = 0; p < kNumProjections; ++p)
      a.xa[p] = layers[size_t(l)].proj[p].lora_a >= 0 ? k.take<bf16_t>(N * r) : nullptr;
    for (Linear& lin : layers[size_t(l)].proj) {
      if (lin.magnitude < 0) continue;
      lin.dora_pre = k.take<bf16_t>(N * lin.out);
      lin.dora_norm = k.take<float>(lin.out);
      lin.dora_scale = k.take<float>(lin.out);
    }
    if (c.sandwich_norms) {
      a.o = k.take<bf16_t>(N * C);
      a.rstd_o = k.take<float>(N);
      a.down = k.take<bf16_t>(N * C);
      a.rstd_down = k.take<float>(N);
    }
  }
}

// The three phases' scratch, each from its overlay's start (lay_out_activations).
void Decoder::Impl::lay_out_phase_scratch(const DecoderConfig& c, const TrainingSetup& setup,
                                          const ActivationNeeds& needs, Overlay& loss, Overlay& attention,
                                          Overlay& projection) {
  const int64_t C = c.hidden_size;
  ce_scratch = loss.take<char>(int64_t(ce_scratch_bytes));
  head_weight = needs.head_nf4 ? loss.take<bf16_t>(head_rows * C) : nullptr;  // beside the chunk's
  head_dropped = needs.head_dora_dropout ? loss.take<bf16_t>(N * C) : nullptr;
  head_ddropped = needs.head_dora_dropout ? loss.take<float>(N * C) : nullptr;
  attn_scratch =
      needs.any_flash_attention ? attention.take<float>(attention_backward_scratch_floats(needs.attention)) : nullptr;
  attn_tc_scratch = needs.any_tc_attention
                        ? attention.take<float>(flash_attention_tc_backward_scratch_floats(needs.attention))
                        : nullptr;
  attn_gemm_scratch = needs.any_gemm_attention
                          ? attention.take<char>(int64_t(attention_gemm_scratch_bytes(needs.attention)))
                          : nullptr;
  nf4_weight = needs.nf4_largest > 0 ? projection.take<bf16_t>(needs.nf4_largest) : nullptr;
  dropped_x = setup.lora_dropout > 0 && needs.lora_in_largest > 0
                  ? projection.take<bf16_t>(N * needs.lora_in_largest)
                  : nullptr;
  dora_w = needs.dora_weight_largest > 0 ? projection.take<float>(needs.dora_weight_largest) : nullptr;
  dora_d = needs.dora_weight_largest > 0 ? projection.take<bf16_t>(N * needs.dora_out_largest) : nullptr;
  dora_p1 = needs.dora_weight_largest > 0 && setup.lora_dropout > 0
                ? projection.take<bf16_t>(N * needs.dora_out_largest)
                : nullptr;
}

void Decoder::Impl::build_rope_table(const DecoderConfig& c, int64_t rows) {
  cpu::RopeTable table(c.head_dim, c.rope_theta, c.rope_scaling, rows);
  const size_t table_floats = size_t(rows) * size_t(c.head_dim / 2);
  rope_cos = DeviceBuffer(table_floats * sizeof(float));
  rope_sin = DeviceBuffer(table_floats * sizeof(float));
  rope_cos.upload(table.cos(0), table_floats * sizeof(float));
  rope_sin.upload(table.sin(0), table_floats * sizeof(float));
  rope_rows = rows;
}

std::string Decoder::memory_report() const {
  std::ostringstream os;
  const MemoryPlan& m = plan_bytes_;
  os << "planned device memory: parameters " << gib(m.parameters) << ", gradients " << gib(m.gradients)
     << ", AdamW state " << gib(m.optimizer) << ", activations " << gib(m.activations)
     << " (of which the loss's scratch " << gib(m.loss_scratch) << ", chunks of " << impl_->ce_chunk << " tokens, "
     << gib(m.loss_overlaid) << " of it over buffers the loss leaves idle"
     << (setup_.activation_checkpointing ? "; checkpointed: each layer's input kept, one layer's recomputed, the MLP " +
                                               std::to_string(impl_->mlp_rows) + " tokens at a time"
                                         : std::string())
     << (setup_.activation_offloading ? "; offloaded: the layer inputs in two slots, the rest in pinned host memory"
                                      : "")
     << "), total " << gib(m.total());
  if (setup_.optimizer_shards > 1)
    os << "; AdamW state sharded: this GPU's " << shard_.size << " of " << shard_.size * setup_.optimizer_shards
       << " gradient elements (shard " << setup_.optimizer_shard << " of " << setup_.optimizer_shards << ")";
  if (setup_.shard_gradients)
    os << "; gradients sharded (ZeRO-2): this GPU's f32 accumulators " << gib(m.grad_accumulators)
       << ", two layers' slots (one written, one reduce-scattering) " << gib(m.grad_layer_slots)
       << (whole_units_shared(config_) ? ", the final norm + head's and then the embedding's whole, in one buffer "
                                        : ", the embedding's and the final norm + head's whole ")
       << gib(m.grad_whole_units);
  if (setup_.shard_weights)
    os << "; weights sharded (ZeRO-3): this GPU's pieces of the layers' "
       << (setup_.full_finetune       ? "bf16 weights "
           : setup_.quantize_base ? "frozen bf16 base weights and NF4 codes and scales "
                                  : "frozen bf16 base weights ")
       << gib(m.weight_pieces) << " (in parameters), "
       << (setup_.prefetch_weights ? "two layers' gather slots (one computes, one prefetches) "
                                   : "one layer's gather slot (no prefetch: each layer gathered as it computes) ")
       << gib(m.weight_slots)
       << (setup_.full_finetune ? ", the embedding and the final norm + head whole"
                                : ", the embedding, the final norm, the head (NF4 or not) and the adapters whole");
  if (setup_.activation_offloading) os << "; pinned host memory for offloaded layer inputs " << gib(m.host_offload);
  if (setup_.quantize_base)
    os << "; QLoRA: NF4 base " << (setup_.shard_weights ? "held whole (lm_head's) " : "") << gib(m.nf4_base)
       << " (in parameters), dequantisation scratch " << gib(m.nf4_scratch)
       << " (in activations"
       << (impl_->output.lora_a >= 0
               ? "; lm_head's in blocks of " + std::to_string(impl_->head_rows) + " rows, in the loss's scratch"
               : std::string())
       << ")";
  size_t used = 0, total = 0;
  device_memory_info(&used, &total);
  os << "; device in use (driver, incl. context and cuBLASLt workspace) " << gib(used) << " of " << gib(total)
     << "; activation arena peak use " << gib(impl_->act_arena->peak());
  return os.str();
}

void Decoder::set_profiling(bool on) {
  Impl& s = *impl_;
  if (on && s.events.empty()) {
    s.events.resize(4 + 6 * size_t(config_.num_layers));
    for (auto& e : s.events) KTUNE_CUDA_CHECK(cudaEventCreate(&e));
  }
  s.profiling = on;
}

}  // namespace ktune::cuda
