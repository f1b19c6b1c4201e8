// cuda::Decoder: one training step of the Llama-family decoder (llama, qwen2, mistral, gemma2) on an
// NVIDIA GPU, everything device-resident: embedding, per layer RMSNorm, q/k/v/o with grouped-query
// heads, RoPE (HF half-split, the CPU RopeTable's angles), causal attention, the gated MLP, the final
// norm, the output projection fused with cross-entropy in chunks (tied or untied head), LoRA on any
// of the seven projections (A, B trainable, the base frozen: no weight-gradient GEMM for it) and on
// the untied output projection (lm_head, inside the fused loss), or full fine-tuning, and the AdamW
// step. The math mirrors the CPU model::Decoder (src/model/decoder.cpp) and model::LoraAdapter
// (src/model/adapters/lora_adapter.cpp):
//   layer: h = x + [post_attn_norm](o(attn(rope(q(n1)), rope(k(n1)), v(n1)))),  n1 = norm1(x)
//          y = h + [post_ff_norm](down(act(gate(n2)) * up(n2))),               n2 = norm2(h)
//   LoRA:  proj(x) = x W^T + b + (alpha / r) (x A^T) B^T
//   lm_head with LoRA (LoraAdapter::fused_output_cross_entropy): logits = h W^T + (alpha / r) (h A^T) B^T,
//          h A^T once for all rows, the low-rank term added to each chunk's logits, W frozen
// The families differ only through DecoderConfig's fields (the CPU ModelConfig's): q/k/v biases
// (qwen2; llama's attention_bias adds o_proj's, mlp_bias the MLP's), sliding windows per layer (mistral: every layer; gemma2: alternate layers), and gemma2's
// sandwich norms (bracketed above), (1 + w) norm weights, sqrt(hidden)-scaled embeddings, GELU-tanh
// gating, attention and final-logit soft-caps and query_pre_attn_scalar. A layer with a window
// (shorter than seq_len) or a soft-cap runs the GEMM path, the tiled kernels (attention.h) or the
// fused tensor-core kernel as TrainingSetup::attention says (all three mask and cap).
//
// Precision (the torchtune `dtype: bf16` setting): weights, LoRA A/B, activations and activation
// gradients are bf16; every GEMM accumulates in f32 (cuBLASLt); norms, softmax, loss and rotary
// angles are computed in f32; weight gradients are f32 and accumulate (+=) over steps until
// zero_grad(); AdamW keeps m and v in bf16 and rounds param, m, v stochastically
// (cuda::adamw_step_bf16). The residual stream is bf16, as in a bf16 PyTorch model.
//
// Memory is planned once, for the (batch, seq_len) given at construction: four DeviceArenas —
// parameters (bf16), gradients (f32, trainable only), optimizer state (bf16 m and v, trainable only;
// of this rank's slice of the gradient buffer when TrainingSetup::optimizer_shards > 1),
// activations (everything a step's forward saves for its backward, the backward's scratch and the
// loss's chunk scratch). memory_report() prints the plan and what the driver reports in use.
// Decoder::plan() computes the same plan without allocating it. A step may be smaller than the plan:
// forward_backward and forward_loss take the step's own seq_len and batch (<= the planned ones) and
// run every kernel on (that batch, that seq_len) in the front of the planned buffers, so a batch of
// short samples costs its own length, and a padding-free batch (its samples re-laid into fewer
// rows, data/padding_free.h) its own rows. The attention kernel of each layer is chosen once, for the planned seq_len
// (a window shorter than it stays in the layer's shape at shorter steps, where it masks what it did).
//
// Activation checkpointing (TrainingSetup::activation_checkpointing, torchtune's
// enable_activation_checkpointing): the forward keeps only each layer's input (the residual stream,
// (B, T, C) bf16 per layer) and writes every layer's other activations into ONE layer's worth of
// scratch; the backward runs a layer's forward again from its saved input into that scratch just
// before the layer's backward. The recomputation is the forward itself (the same kernels, bf16
// roundings, LoRA dropout masks from the same key, NF4 dequantisation, DoRA norms), so the gradients
// are those without checkpointing; the activation arena shrinks by (num_layers - 1) layers' worth.
//
// QLoRA (TrainingSetup::quantize_base): the adapted projections' frozen base weights as NF4 (lm_head's
// too when it carries LoRA, as the CPU adapter does; with quantize_unadapted the layers' other
// projections too, as the CPU FrozenNf4Adapter). LoRA dropout (TrainingSetup::lora_dropout): the
// CPU adapter's masks, redrawn on the device. DoRA (TrainingSetup::use_dora): the CPU adapter's math
// (dora.h), on lm_head too (inside the fused loss, cross_entropy.h's LoraHead).
//
// Packed batches (torchtune's dataset.packed): forward_backward and forward_loss take the step's
// positions and doc ids ((B, T) host arrays, the CPU data::Batch's), uploaded per step: RoPE turns
// each token by its own position (restarting per document; the rotary table grows, as the CPU one
// does, when a sample split across packs counts past it) and attention masks across documents
// (token i sees key j iff causal, in the window, and doc_ids[b, i] == doc_ids[b, j]): each layer's
// attention kernel (tiled, GEMM or fused tensor-core) takes the doc ids, so a packed step runs the
// kernels planned for it.
//
// Activation offloading (TrainingSetup::activation_offloading, with checkpointing): the kept layer
// inputs (and the final norm's) share two device slots; those the forward overwrites go to pinned
// host memory and come back one layer ahead of the backward, overlapping the compute on a stream of
// their own (activation_offload.h).
//
// Data-parallel sharding over optimizer_shards ranks (the collectives are the caller's, through
// hooks: this file does not depend on dist/): the AdamW state (ZeRO-1), a full fine-tune's gradients
// unit by unit, each unit's reduce-scatter on the hook's stream while the next layer's backward runs
// (shard_gradients, ZeRO-2) and the layers' weights (a full fine-tune's, or LoRA's frozen
// base), gathered into two layer slots, the next layer's gather on the hook's stream while a layer
// computes (shard_weights, ZeRO-3).
//
// It deliberately does not do gradient clipping or loading checkpoints (weights are random or
// uploaded by name). The recipes drive it through train/cuda_trainer.h (device=cuda), which loads
// and saves checkpoints through the CPU engine's host model and clips over gradient_buffer().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/adamw.h"  // AdamWStep (a plain struct)
#include "kernels/cpu/rope.h"   // RopeScaling, RopeTable (plain C++, compiled into this library)

struct CUevent_st;  // cudaEvent_t's pointee (the collectives' events), without the CUDA runtime's header

namespace ktune::cuda {

struct DecoderConfig {
  int64_t vocab_size = 0, hidden_size = 0, num_layers = 0, num_heads = 0, num_kv_heads = 0, head_dim = 0;
  int64_t intermediate_size = 0;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 500000.0f;
  cpu::RopeScaling rope_scaling;
  bool tie_word_embeddings = true;
  // The other families, as the CPU model::ModelConfig reads them from config.json (the defaults are
  // Llama's: none of it). Names and meanings are ModelConfig's.
  bool qkv_bias = false;  // qwen2: biases on q_proj, k_proj, v_proj (trainable when the base is)
  bool o_bias = false;    // a bias on o_proj (llama's attention_bias sets it with qkv_bias)
  bool mlp_bias = false;  // biases on gate_proj, up_proj, down_proj (llama's mlp_bias)
  // Per layer, 0 = full causal attention; empty = none anywhere. Token i sees key j iff
  // i - window < j <= i. mistral: config sliding_window on every layer (null: none); gemma2: the
  // layers HF marks "sliding_attention" (by default the even ones, 0, 2, ...).
  std::vector<int64_t> sliding_window;
  float attention_scale = 0;       // q.k multiplier; 0 = 1/sqrt(head_dim). gemma2: query_pre_attn_scalar^-0.5
  float attn_logit_softcap = 0;    // 0 = off (gemma2: attn_logit_softcapping)
  float final_logit_softcap = 0;   // 0 = off (gemma2: final_logit_softcapping)
  float norm_weight_offset = 0;    // 1 for gemma's x * (1 + w) (norm weights then start at 0)
  bool sandwich_norms = false;     // gemma2: post_attention_layernorm on the attention output,
                                   // pre_feedforward_layernorm / post_feedforward_layernorm around the MLP
  bool scale_embeddings = false;   // gemma: embeddings times sqrt(hidden_size), rounded to bf16 as HF does
  enum class Activation { kSiLU, kGeluTanh } activation = Activation::kSiLU;  // of act(gate) * up

  // The window of a layer (0: none).
  int64_t window(int64_t layer) const {
    return sliding_window.empty() ? 0 : sliding_window[static_cast<size_t>(layer)];
  }

  // meta-llama/Llama-3.2-1B's config.json.
  static DecoderConfig llama3_2_1b();
};

// The seven projections of a layer, in HF order.
constexpr int kNumProjections = 7;
enum Projection : int { kQ = 0, kK, kV, kO, kGate, kUp, kDown };
// "q_proj", ..., "down_proj" ("?" out of range). Inline: the recipes' plan (train/device_selection)
// reads it without linking the CUDA library.
inline const char* projection_name(int p) {
  constexpr const char* kNames[kNumProjections] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                   "gate_proj", "up_proj", "down_proj"};
  return (p >= 0 && p < kNumProjections) ? kNames[p] : "?";
}

struct TrainingSetup {
  int64_t batch = 1, seq_len = 1;
  // true: every base parameter trainable (full fine-tune); false: only the LoRA matrices.
  bool full_finetune = false;
  int64_t lora_rank = 0;  // > 0 attaches LoRA to the projections lora_on names
  float lora_alpha = 0;
  bool lora_on[kNumProjections] = {};
  // LoRA on the output projection (torchtune's apply_lora_to_output; the CPU engine's adapter on
  // "lm_head", PEFT names base_model.model.lm_head.lora_A.weight / .lora_B.weight): inside the fused
  // loss, logits = h Wᵀ + s (h' Aᵀ) Bᵀ with h' = dropout(h) (module "lm_head"), W frozen. An untied
  // head only: a tied one is the embedding table, no projection of its own (refused, as the CPU
  // engine and torchtune refuse it). With quantize_base its W is NF4 too (the CPU adapter quantises
  // every base it attaches to, lm_head included). With use_dora, DoRA on lm_head as the CPU adapter's
  // fused loss: logits = c ⊙ (h Wᵀ + s (h Aᵀ) Bᵀ), c = m / ‖W + s B A‖ per vocabulary row (the norm
  // detached; `base_model.model.lm_head.lora_magnitude_vector`, (V)); the norms are computed
  // head_block_rows rows at a time into two (V) f32 buffers before the loss.
  bool lora_on_output = false;
  // lm_head's vocabulary rows per block (0: 4096) where its W is read a block at a time: QLoRA's NF4
  // W dequantised per block before each of the fused loss's GEMMs that read it (scratch: a block of
  // (rows, hidden) bf16, not (vocab, hidden)), and DoRA's norms. With an NF4 head rows * hidden must be
  // a multiple of 64.
  int64_t head_block_rows = 0;
  // Tokens per chunk of the fused loss (scratch: chunk * vocab * 6 bytes). 0: 512, where the head's
  // GEMMs (512 rows against the whole vocabulary) are still compute-bound on an H200 (0.37 GiB at
  // Llama 3's 128256-token vocabulary).
  int64_t ce_chunk_tokens = 0;
  // Attention kernels: kGemm (kernels/cuda/attention_gemm.h: cuBLASLt tensor-core GEMMs over one
  // head's (B, T, T) scores at a time), kFlash (kernels/cuda/attention.h: tiled, on the CUDA cores)
  // or kTensorCore (kernels/cuda/flash_attention_tc.h: fused FlashAttention-2 on the tensor cores,
  // head_dim 64 or 128 only, other head sizes run kGemm; sliding windows and soft-caps included).
  // All three take doc ids (packed steps). kAuto: the fastest of them that agrees with the others on
  // this GPU (model/cuda/attention_choice.h), chosen before the decoder is built (the recipes' trainer
  // does): the constructor refuses it; Decoder::plan plans it as kGemm, the larger scratch.
  enum class Attention { kGemm, kFlash, kTensorCore, kAuto } attention = Attention::kGemm;
  // QLoRA (the CPU LoraOptions::quantize_base): the frozen base weight of every projection that
  // carries LoRA (lora_on; lm_head with lora_on_output, which torchtune keeps unquantised), and with
  // quantize_unadapted of the layers' other projections too, held on the device only as NF4
  // (DeviceParameter::nf4_codes / nf4_scales, kernels/cpu/nf4.h's layout: blocks of 64, a scale
  // each, torchao's double-quantised one, a bf16 value held as bf16), quantised on the host when uploaded by the CPU quantiser
  // in bf16 arithmetic (kernels/cpu/nf4_codes.cpp, compiled in: torchtune's QLoRA's NF4 of a bf16 model),
  // so the codes and scales are the CPU engine's bit for bit. Each GEMM that reads such
  // a weight dequantises it to bf16 scratch first (one projection at a time; lm_head's a block of head_block_rows
  // vocabulary rows at a time, inside the fused loss). Needs LoRA and no full_finetune.
  bool quantize_base = false;
  // QLoRA: the layers' projections without LoRA in NF4 too (the CPU model::FrozenNf4Adapter): what
  // torchtune's Llama, Mistral and Gemma 2 QLoRA builders do (FrozenNF4Linear; its QLoRA configs adapt
  // q, v, o and the MLP, so k_proj); its Qwen2 ones keep them in bf16 (model::qlora_quantizes_unadapted).
  // Needs quantize_base. lm_head without LoRA stays bf16 either way.
  bool quantize_unadapted = false;
  // QLoRA: the layers' NF4 projections (without DoRA, of shapes kernels/cuda/nf4_gemm.h takes) run
  // the GEMM that dequantises W tile by tile in shared memory (forward and input gradient) instead of
  // dequantising W into bf16 scratch for cuBLASLt; the scratch is then planned only for the weights
  // that still need it. Same bf16 values, another order of the f32 sums. Which is faster is
  // bench/gpu's to measure: off by default (env KTUNE_CUDA_NF4_GEMM=fused in the recipes).
  bool nf4_fused_gemm = false;
  // LoRA dropout (the CPU LoraOptions::dropout, in [0, 1)): PEFT's, on each adapter's input only,
  // kept elements scaled by 1/(1 - p), in forward_backward (not forward_loss). The masks are the CPU
  // LoraAdapter's for the same (lora_seed, key, module name, element index) (lora_dropout.h), the key
  // set per micro-batch by set_dropout_key; lora_seed is the CPU LoraOptions::seed.
  float lora_dropout = 0;
  uint64_t lora_seed = 0;
  // DoRA (the CPU LoraOptions::use_dora; PEFT's): y = c ⊙ (x Wᵀ + s (x Aᵀ) Bᵀ) + b with c = m / ‖W + s B A‖
  // per output row (the norm detached), m a trainable magnitude per adapted projection
  // (`base_model.model.<module>.lora_magnitude_vector`, (out), starting at the row norms of W); with
  // dropout PEFT's y = x Wᵀ + b + (c − 1) ⊙ x' Wᵀ + c ⊙ s (x' Aᵀ) Bᵀ. Needs LoRA and no full_finetune;
  // combines with quantize_base (the norms of the dequantised NF4 W).
  bool use_dora = false;
  // Activation checkpointing (torchtune's enable_activation_checkpointing): keep each layer's input
  // only and recompute the layer's forward, into one layer's scratch, just before its backward. The
  // same gradients for one more forward's time (about a third more per step).
  bool activation_checkpointing = false;
  // With activation checkpointing the MLP runs over chunks of this many tokens (0: 2048), forward and
  // backward: gate, up and their activation are planned for one chunk ((chunk, intermediate) each,
  // not (batch * seq_len, intermediate)), and the backward runs each chunk's MLP forward again just
  // before its backward. The weight gradients sum over the chunks (the same gradients up to the
  // order of f32 additions). Without checkpointing it has no effect (every layer keeps all rows).
  int64_t mlp_chunk_tokens = 0;
  // Activation offloading (torchtune's enable_activation_offloading; needs activation_checkpointing):
  // the layer inputs that checkpointing keeps go to pinned host memory as the forward runs and come
  // back one layer ahead of the backward, on a copy stream of their own (model/cuda/activation_offload.h):
  // two (B, T, C) buffers on the device instead of num_layers + 1, the same gradients bit for bit.
  bool activation_offloading = false;
  // Sharded AdamW state over data-parallel GPUs (ZeRO-1/2; the distributed recipes on GPUs, where
  // torchtune shards with FSDP): optimizer_shards ranks, this one optimizer_shard. The gradient
  // buffer is padded to a multiple of optimizer_shards * 64 floats and cut into that many equal
  // slices; this rank keeps m and v for its slice only (OptimizerShard), and adamw_step updates the
  // values of its slice only: the trainer reduce-scatters the gradients into the slices before the
  // step and all-gathers the updated values after it (train/cuda/cuda_decoder_trainer.cpp). The
  // stochastic rounding's random bits go by element index within each parameter, as unsharded, so
  // the step does not depend on the number of shards. 1: everything (one GPU, or replicas).
  int64_t optimizer_shards = 1, optimizer_shard = 0;
  // ZeRO-2 (a full fine-tune with optimizer_shards > 1 only; LoRA's gradients are small and keep the
  // one buffer): the GRADIENTS sharded too. The trainable parameters fall into gradient units, unit 0
  // the embedding (with a tied head the loss's head gradient too), unit 1 + l layer l's parameters,
  // unit L + 1 the final norm and an untied lm_head; each unit is padded to a multiple of
  // optimizer_shards * 64 floats and rank r owns the piece [r S_u, (r + 1) S_u) of unit u. The device
  // holds units 0 and L + 1 whole, TWO layer slots (each the largest layer unit; layer l's gradients
  // are written into slot l % 2) and this rank's f32 accumulator of its pieces (the shard,
  // OptimizerShard::grad). With an untied head units 0 and L + 1 share one buffer (the larger's
  // size): unit L + 1's gradients are complete after the loss and the final norm, the embedding's
  // are written only by the backward's last kernel, and by then unit L + 1's reduce-scatter, enqueued
  // before the layers' backward, has long finished (the backward waits for it and adds its piece
  // before it zeroes the buffer for the embedding). A tied head writes unit 0 in the loss: two
  // buffers. As soon as a unit's gradients of the micro-batch are complete (after the final norm's
  // backward, after each layer's, after the embedding's) forward_backward hands the unit to the
  // gradient reduce (set_gradient_reduce), which enqueues its in-place reduce-scatter on the
  // collectives' stream while the next layer's backward runs into the other slot (FSDP's overlap);
  // the decoder adds this rank's reduced piece into the accumulator on the default stream once that
  // reduce-scatter is done, right before the slot is zeroed for the layer two below, and at the end
  // of the backward for whatever is still pending.
  bool shard_gradients = false;
  // ZeRO-3 (FSDP's weight sharding, optimizer_shards > 1): the LAYERS' bf16 weights that a rank would
  // otherwise hold whole are sharded in per-layer weight units (Decoder::weight_units(): rank r stores
  // only its piece [r S_l, (r + 1) S_l) of layer l's unit). A full fine-tune (needs shard_gradients)
  // shards every layer parameter, in its gradient unit's layout (weight unit l = gradient unit 1 + l,
  // element e where the gradient's element e lies), and AdamW updates the piece in place: no values
  // are gathered after the step. LoRA / DoRA / QLoRA shard the layers' FROZEN weights (the base
  // projections and norms in bf16, QLoRA's NF4 codes and scales as bytes in the same unit, a unit
  // counted in bf16 elements; the adapters, magnitudes and anything trainable keep ZeRO-1), each at a
  // 256-byte aligned place in its layer's unit, padded to a multiple of optimizer_shards * 64. Every
  // sharded parameter's `value` (an NF4 one's nf4_codes and nf4_scales) points into one of TWO device
  // weight slots (each the largest unit, bf16; layer l's in slot l % 2), so that the next layer's gather
  // (FSDP's prefetch) runs on the collectives' stream while this layer computes: the forward gathers
  // layer l + 1 while layer l runs, the backward layer l - 1 while layer l runs (checkpointing's
  // recompute shares the backward's gather), each ordered by CUDA events (set_weight_gather). A layer
  // still in its slot is not gathered again: the backward starts on the forward's last two layers,
  // and the next micro-batch's forward on the backward's first two (until AdamW moves a full
  // fine-tune's pieces on). The embedding, the final norm and the head stay whole on every rank.
  bool shard_weights = false;
  // shard_weights: the next layer's gather enqueued while a layer computes, into the other of two
  // slots (FSDP's prefetch). false: ONE slot, each layer gathered when it is about to compute (the
  // gather not overlapped with compute), one layer's weights less on the GPU.
  bool prefetch_weights = true;
};

// One named parameter on the device. grad is nullptr when frozen; m, v when frozen or when none
// of its elements lie in this rank's optimizer shard.
struct DeviceParameter {
  std::string name;   // HF (base) or PEFT (LoRA) name
  std::vector<int64_t> shape;
  int64_t numel = 0;
  // bf16; nullptr for an NF4 (QLoRA) base weight, held in nf4_codes / nf4_scales. With shard_weights a
  // sharded parameter's value (weight_layer >= 0; an NF4 one's codes and scales) lies in its layer's
  // weight slot (slot weight_layer % 2): valid only while its layer is gathered there
  // (Decoder::gather_weights, or inside forward_backward / forward_loss).
  bf16_t* value = nullptr;
  // f32, accumulates; gradient_buffer() + grad_offset. With shard_gradients: in its unit's buffer
  // (gradient_units()), this micro-batch's gradient until its reduce-scatter (set_gradient_reduce) runs.
  float* grad = nullptr;
  int64_t grad_offset = 0;  // trainable: its gradient's first element in gradient_buffer() (the units' layout)
  // Trainable: its elements [shard_begin, shard_end) lie in this rank's optimizer shard (all of them
  // unsharded; an empty range when none do).
  int64_t shard_begin = 0, shard_end = 0;
  bf16_t* m = nullptr;  // bf16 AdamW state of elements [shard_begin, shard_end)
  bf16_t* v = nullptr;
  // The f32 gradient AdamW reads for element shard_begin (shard_grad[k]: element shard_begin + k's):
  // grad + shard_begin, or with shard_gradients the reduced sums in the shard's accumulator.
  float* shard_grad = nullptr;
  // The bf16 value AdamW updates for element shard_begin: value + shard_begin, or with shard_weights
  // (a full fine-tune's layer parameter) its place in this rank's piece of its weight unit.
  bf16_t* shard_value = nullptr;
  // shard_weights: the layer whose weight unit holds this parameter's bf16 value (-1: held whole) and
  // its first element's place in that unit (and in its weight slot); an NF4 parameter's codes are
  // there (numel / 4 bf16 elements' bytes) and its scales at nf4_scales_offset (numel / 64).
  int64_t weight_layer = -1, weight_offset = 0, nf4_scales_offset = 0;
  int64_t unit = 0;  // trainable: its gradient unit (gradient_units(); unit 0 unless shard_gradients)
  uint8_t* nf4_codes = nullptr;  // TrainingSetup::quantize_base: (numel / 2) bytes, two codes a byte
  // (numel / 64) scales, double quantised in bf16 arithmetic and so bf16 values, held as bf16 (4.25 bits a
  // weight with the codes; torchao's int8 + a factor per 256 blocks: 4.13) (both in the slot when sharded, as value)
  bf16_t* nf4_scales = nullptr;
};

struct StepResult {
  double loss_sum = 0;  // sum of token cross-entropies over valid labels (unscaled)
  int64_t n_valid = 0;
};

class Decoder {
 public:
  // Allocates every arena and initialises the parameters: base weights uniform with std 0.02
  // (seeded), norms at their identity (1, or 0 with gemma's offset), biases 0, LoRA A
  // kaiming-uniform (bound 1/sqrt(in)) and B zero, as PEFT.
  Decoder(const DecoderConfig& config, const TrainingSetup& setup, uint64_t seed = 0);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const DecoderConfig& config() const { return config_; }
  const TrainingSetup& setup() const { return setup_; }
  std::vector<DeviceParameter>& parameters() { return params_; }
  DeviceParameter& parameter(const std::string& name);  // throws ktune::Error naming it when absent
  int64_t parameter_count(bool trainable_only) const;

  // Host f32 values, rounded to bf16 (nearest even) on the way in; widened on the way out. An NF4
  // base weight (quantize_base) is quantised on the way in (cpu::nf4_quantize) and dequantised on the way
  // out (bf16(code value * block scale), as torchao): uploading what download_value returned gives the
  // same codes (not the same scales: the double quantisation's mean and groups move).
  void upload(const std::string& name, const std::vector<float>& values);
  // Host bf16 values as they are (a bf16 checkpoint's mapped pages: no f32 widening, nor a bf16 copy,
  // on the way in), the same as upload() of their f32 widening; an NF4 base widens them to quantise,
  // a chunk at a time (upload_read).
  void upload_bf16(const std::string& name, const bf16_t* values, int64_t numel);
  // Writes elements [first, first + count) of a host value, as f32, into out.
  using ValueReader = std::function<void(int64_t first, int64_t count, float* out)>;
  // The reader of host f32 values x (x + first, count of them, copied as they are).
  static ValueReader reader_of(const float* x);
  static constexpr int64_t kUploadChunk = int64_t(1) << 20;  // values read at a time: 6 MiB of host buffers
  // The same as upload() of the values `read` gives, read `chunk` values at a time (an NF4 base: whole
  // 64-value blocks, at least one), so that the host holds one chunk in f32 and in bf16 rather than
  // a converted copy of the whole value (a file read in another dtype than the GPU's: the embedding
  // of Gemma 2 27B's f32 checkpoint is 2.4 GB in bf16). With shard_weights, a layer's parameter reads
  // only the elements of this rank's piece: 1/W of the value's pages on each of W ranks (an NF4 one
  // reads every block, for its absmax, and quantises the blocks its piece of the codes covers).
  void upload_read(const std::string& name, const ValueReader& read, int64_t chunk = kUploadChunk);
  // With shard_weights, a layer's parameter: upload writes this rank's piece only; download_value
  // reads the layer's weight slot and throws unless its layer is gathered there (gather_weights).
  std::vector<float> download_value(const std::string& name);
  std::vector<float> download_grad(const std::string& name);  // throws when frozen

  // One forward and backward over host tokens and labels (batch * seq_len each, row-major;
  // labels are the target of each position, -100 ignored). seq_len and batch: this step's, 1..the
  // planned ones (0: the planned one); throws ktune::Error beyond them. The result is that of a
  // decoder planned for exactly this (batch, seq_len) (the same kernels on the same shapes). Gradients ACCUMULATE scaled by
  // grad_scale (1/n_valid for a token mean). Synchronises once (the loss comes back).
  // positions, doc_ids: a packed batch's, (batch * seq_len) each like tokens, or nullptr (positions
  // 0..seq_len-1 in every row; causal attention only). Positions must be >= 0 (a negative one throws
  // after the step, as a bad token id does).
  StepResult forward_backward(const int32_t* tokens, const int32_t* labels, float grad_scale, int64_t seq_len = 0,
                              const int32_t* positions = nullptr, const int32_t* doc_ids = nullptr, int64_t batch = 0);
  // The forward and the fused loss only (validation): no backward, gradients untouched, the same
  // loss as forward_backward's on the same batch. It overwrites the saved activations, so it runs
  // between steps, never between a forward_backward and what reads its gradients (nothing does).
  // No LoRA dropout (evaluation, as PEFT's eval mode). seq_len, positions, doc_ids and batch as
  // forward_backward's. Synchronises once.
  StepResult forward_loss(const int32_t* tokens, const int32_t* labels, int64_t seq_len = 0,
                          const int32_t* positions = nullptr, const int32_t* doc_ids = nullptr, int64_t batch = 0);
  // The LoRA dropout masks' key for the following steps (the CPU LoraAdapter::set_dropout_key; the
  // trainer sets a new one per micro-batch). 0 until set.
  void set_dropout_key(uint64_t key);
  // The whole gradient arena (gaps between parameters included; with shard_gradients the units, the
  // two layer slots and the accumulators).
  void zero_grad();
  // Every trainable parameter's gradient lies in one contiguous f32 buffer of *count floats (the
  // alignment gaps between them zeroed by zero_grad): what a data-parallel all-reduce, the gradient
  // norm and clipping's scaling each take in one call.
  // The count is padded to a multiple of optimizer_shards * 64 (the padding zeroed too).
  // Not with shard_gradients (no such buffer: throws ktune::Error).
  float* gradient_buffer(int64_t* count);
  // The gradient units (TrainingSetup::shard_gradients), in the layout that a parameter's grad_offset
  // indexes: unit u holds elements [begin, begin + size) of it, size a multiple of optimizer_shards *
  // 64, written during the backward at grads (grads[e - begin] is element e; units 0 and L + 1 a
  // buffer each, layer l's unit 1 + l the gradient slot l % 2). piece = size / optimizer_shards;
  // this rank's piece of the unit is elements [begin + shard * piece, + piece), at shard_offset in
  // the OptimizerShard.
  // Without shard_gradients: one unit, the whole gradient buffer (grads == gradient_buffer()).
  struct GradientUnit {
    int64_t begin = 0, size = 0, piece = 0, shard_offset = 0;
    float* grads = nullptr;
  };
  const std::vector<GradientUnit>& gradient_units() const { return units_; }
  // shard_weights: layer l's weight unit, weight_units()[l]: the bf16 values of the layer's sharded
  // parameters (each at its weight_offset; an NF4 one's codes there and its scales at
  // nf4_scales_offset, as bytes), size elements (a multiple of optimizer_shards * 64; gaps
  // and padding zero), piece = size / optimizer_shards; this rank's piece, elements [shard * piece,
  // (shard + 1) * piece), at piece_values. A full fine-tune's is its gradient unit's layout (1 + l).
  // Empty without shard_weights.
  struct WeightUnit {
    int64_t size = 0, piece = 0;
    bf16_t* piece_values = nullptr;
  };
  const std::vector<WeightUnit>& weight_units() const { return weight_units_; }
  // shard_gradients: the collective that sums a gradient unit over the ranks, stream-ordered (the
  // caller's, like WeightGather). Every rank enqueues the same reduce-scatters in the same order
  // (units L + 1, L, ..., 1, 0, once per micro-batch).
  //   enqueue(unit, ready, done): gradient_units()[unit].grads holds this micro-batch's gradients of
  //     the unit once `ready` has completed (an event the decoder recorded on the default stream
  //     behind the unit's last backward kernel). It enqueues the in-place f32 sum reduce-scatter of
  //     the buffer (this rank's summed piece lands at grads + shard * piece) on a stream of its own,
  //     behind `ready`, records `done` behind it there, and returns at once. The decoder's default
  //     stream waits for `done` before it reads the piece (adding it into this rank's accumulator,
  //     OptimizerShard::grad + shard_offset) and before anything rewrites the buffer. (A blocking
  //     implementation may synchronise the device, reduce, and leave `done` unrecorded, as
  //     WeightGather's may.)
  //   wait_all(): returns once every reduce-scatter enqueued so far has completed, or throws the
  //     collective's Error, by polling. The decoder calls it before every host synchronisation of a
  //     step (with WeightGather::wait_all), so that no cudaDeviceSynchronize waits on one.
  // The backward never waits on the host for a reduce-scatter; forward_backward returns with every
  // unit's piece added into the accumulator and every reduce-scatter polled.
  struct GradientReduce {
    std::function<void(int64_t unit, CUevent_st* ready, CUevent_st* done)> enqueue;
    std::function<void()> wait_all;
  };
  void set_gradient_reduce(GradientReduce reduce) { gradient_reduce_ = std::move(reduce); }
  // shard_weights: the collective that assembles a layer's weight unit in its weight slot, stream-ordered
  // (the caller's: this file does not depend on dist/). Every rank enqueues the same gathers in the
  // same order (the steps' layers, gather_weights).
  //   enqueue(layer, slot, ready, done): `slot` (bf16, laid out like the weight unit) holds this rank's
  //     piece at [shard * piece, (shard + 1) * piece) once `ready` has completed (an event the decoder
  //     recorded on the default stream behind the piece's copy into the slot and behind every kernel
  //     that read the slot's previous layer). It enqueues the in-place all-gather of the other ranks'
  //     pieces on a stream of its own, behind `ready` (cudaStreamWaitEvent), records `done` behind it
  //     there, and returns at once; the decoder's default stream waits for `done` right before the
  //     first kernel that reads the slot, and before anything overwrites the slot again. (A blocking
  //     implementation may synchronise the device, gather, and leave `done` unrecorded: a wait for an
  //     event never recorded is no wait.)
  //   wait_all(): returns once every gather enqueued so far has completed, or throws the collective's
  //     Error (a dead peer, a timeout) — by polling, never by a host wait that a dead peer could hang.
  //     The decoder calls it before every host synchronisation that may depend on a gather (the end
  //     of a step, gather_weights), so that no cudaDeviceSynchronize waits on one.
  struct WeightGather {
    std::function<void(int64_t layer, bf16_t* slot, CUevent_st* ready, CUevent_st* done)> enqueue;
    std::function<void()> wait_all;
  };
  void set_weight_gather(WeightGather gather) { weight_gather_ = std::move(gather); }
  // shard_weights: layer `layer`'s weight unit gathered into its slot (a collective: every rank calls
  // it; nothing to gather when it is there already), complete when it returns, so that download_value
  // can read its parameters. The next step's gathers overwrite the slot.
  void gather_weights(int64_t layer);
  // Whether p's bf16 value is sharded (p.weight_layer >= 0): its value in its layer's slot, this rank's
  // elements in its layer's weight unit piece.
  bool weights_sharded(const DeviceParameter& p) const { return p.weight_layer >= 0; }
  // This rank's shard: [begin, begin + size) of the gradient layout (its pieces of every unit,
  // concatenated: a slice of the gradient buffer without shard_gradients), its f32 gradients grad
  // (the buffer's slice itself, or with shard_gradients the accumulator of the reduced pieces) and
  // its AdamW moments, all laid out alike (m[k] is the moment of grad[k]; gaps and padding included).
  // Unsharded: the whole buffer.
  struct OptimizerShard {
    int64_t begin = 0, size = 0;
    float* grad = nullptr;
    bf16_t* m = nullptr;
    bf16_t* v = nullptr;
  };
  const OptimizerShard& optimizer_shard() const { return shard_; }
  // AdamW over every trainable parameter's elements in this rank's shard (all of them unsharded),
  // from the shard's gradients (shard_grad); s.step is 1-based. Asynchronous.
  void adamw_step(const cpu::AdamWStep& s, uint64_t seed);

  // Where a step's time goes, timed with CUDA events when profiling is on (off by default: the
  // events cost a little). Filled by forward_backward.
  struct StepProfile {
    double attention_ms = 0;  // attention forward + backward (+ checkpointing's second forward), all layers
    double loss_ms = 0;       // output projection + cross-entropy (+ its gradients)
    double step_ms = 0;       // the whole forward_backward on the device
    // Whether the step waits on the host (forward_backward only): the GEMMs it launched (cuBLASLt
    // calls, a few µs of host time each), the host time enqueuing the backward (after the loss's,
    // nothing waited for), and the device time from the loss's end to the step's. Host time well
    // below the device time means the host kept ahead; close to it, either the GPU waited for its
    // work to be enqueued or the host waited for room in the launch queue: bench/gpu's launch-cost
    // line (host µs a launch, measured with the queue held open) tells which.
    int64_t gemm_calls = 0;
    double backward_host_ms = 0, backward_device_ms = 0;
  };
  void set_profiling(bool on);
  const StepProfile& last_profile() const { return profile_; }

  // Bytes planned in each arena, their sum, and what the driver reports in use now.
  struct MemoryPlan {
    size_t parameters = 0, gradients = 0, optimizer = 0, activations = 0;
    size_t loss_scratch = 0;  // of activations: the fused loss's phase scratch (its chunk; with QLoRA on
                              // lm_head a block of W's rows, with DoRA on it and dropout x' and its gradient)
    size_t loss_overlaid = 0;  // of loss_scratch: the bytes laid over buffers the loss leaves idle (the
                               // attention gradients; with checkpointing the shared layer's activations)
    size_t nf4_base = 0;     // of parameters: the NF4 codes and scales held whole (quantize_base; with
                             // shard_weights lm_head's only, the layers' in weight_pieces and the slots)
    size_t nf4_scratch = 0;  // of activations: the largest NF4 weight dequantised to bf16 (quantize_base; lm_head's
                             // a block of head_block_rows rows)
    size_t host_offload = 0;  // pinned HOST memory for offloaded layer inputs (activation_offloading; not in total())
    // Of gradients, with shard_gradients: this rank's accumulators, the two layer slots (each the
    // largest layer unit: one is written by a layer's backward while the other's reduce-scatter
    // runs), and the two whole units (the embedding's; the final norm's and an untied lm_head's: one
    // buffer as large as the larger of the two when the head is untied, TrainingSetup::shard_gradients).
    size_t grad_accumulators = 0, grad_layer_slots = 0, grad_whole_units = 0;
    // Of parameters, with shard_weights: this rank's pieces of the layers' weight units (bf16, QLoRA's
    // NF4 codes and scales included) and the two weight slots, each as large as the largest unit (the
    // rest is whole: the embedding, the final norm, an untied lm_head (NF4 or not), and under LoRA the
    // adapters and the magnitudes).
    size_t weight_pieces = 0, weight_slots = 0;
    size_t total() const { return parameters + gradients + optimizer + activations; }
  };
  MemoryPlan memory_plan() const { return plan_bytes_; }
  // The plan a Decoder(config, setup) would allocate, computed without allocating it (no arena, no
  // parameter initialised) and without touching any device: it runs where no GPU is (`ktune plan
  // --device cuda`). kAuto (a choice made on the GPU) plans the GEMM attention path's scratch.
  static MemoryPlan plan(const DecoderConfig& config, const TrainingSetup& setup);
  // What a run keeps free beside its planned arenas (cuBLASLt's workspace, the rotary table): a plan
  // larger than the device's free memory less this is refused before anything is allocated.
  static constexpr size_t kFreeMemoryMargin = size_t(64) << 20;
  std::string memory_report() const;

 private:
  struct Impl;
  struct PlanOnly {};
  Decoder(const DecoderConfig& config, const TrainingSetup& setup, PlanOnly);
  void validate() const;
  void allocate(bool on_device);  // false: only plan_bytes_ (Decoder::plan)
  // allocate()'s phases (decoder.cu), each filling in the Layout that the later ones read: the
  // parameter table, QLoRA's NF4 set, the gradient units (returns the gradient arena's bytes), the
  // parameters' storage (returns the parameter arena's bytes); then, on the device, the gradient
  // buffers, ZeRO-3's weight slots and every parameter's pointers.
  struct Layout;
  void declare_parameters(Layout& lay);
  void choose_nf4(Layout& lay);
  size_t lay_out_gradients(Layout& lay);
  size_t lay_out_parameters(Layout& lay, size_t* nf4_bytes);
  void allocate_gradients(const Layout& lay);
  void allocate_weight_slots(const Layout& lay);
  void place_parameters(const Layout& lay);
  void init_parameters(uint64_t seed);
  // shard_weights: each parameter's place in its layer's weight unit (-1: held whole; an NF4 one's
  // codes, its scales' in *nf4_scales_offset), weight_units_ sized.
  std::vector<int64_t> weight_unit_layout(const std::vector<int64_t>& layer_of, const std::vector<bool>& trainable,
                                          const std::vector<bool>& nf4, const std::vector<int64_t>& offset_in_unit,
                                          std::vector<int64_t>* nf4_scales_offset);
  struct WeightRange {
    int64_t begin = 0, end = 0;
  };
  // Of the n elements at `offset` in layer `layer`'s weight unit, those in this rank's piece (an empty
  // range when none are), and where element `element` of the unit (in this rank's piece) lies.
  WeightRange weight_piece_range(int64_t layer, int64_t offset, int64_t n) const;
  bf16_t* piece_value(int64_t layer, int64_t element) const;
  // The n elements at `offset` in layer `layer`'s unit, from host (n bf16 elements' bytes): this
  // rank's part of them into its piece; a slot holding the layer is stale then (slot_stale).
  void write_piece(int64_t layer, int64_t offset, const void* host, int64_t n);
  // A weight slot holding layer `layer` no longer holds what its pieces do: the next use gathers it.
  void slot_stale(int64_t layer);
  // The values `read` gives (p.numel, `chunk` at a time in whole blocks) quantised on the host into
  // p's NF4 codes and scales (sharded: codes only for the blocks of this rank's piece of them).
  void upload_nf4(const DeviceParameter& p, const ValueReader& read, int64_t chunk);
  // bf16 values into p's storage: the whole of it, or with shard_weights this rank's piece.
  void store_bf16(const DeviceParameter& p, const bf16_t* host);

  DecoderConfig config_;
  TrainingSetup setup_;
  std::vector<DeviceParameter> params_;
  OptimizerShard shard_;
  std::vector<GradientUnit> units_;
  std::vector<WeightUnit> weight_units_;
  GradientReduce gradient_reduce_;
  WeightGather weight_gather_;
  MemoryPlan plan_bytes_;
  StepProfile profile_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ktune::cuda
