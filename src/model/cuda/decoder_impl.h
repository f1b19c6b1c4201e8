// The private half of cuda::Decoder (decoder.h): its state (Decoder::Impl) and the helpers that the
// files implementing it share. Included by those files only:
//   decoder.cu             construction: the parameter table, the memory plan, the arenas; the report
//   decoder_parameters.cu  parameters by name: initialisation, upload, download, the AdamW step
//   decoder_sharding.cu    ZeRO-3's weight units and slots, ZeRO-2's gradient slots and reduce channels
//   decoder_linear.cu      one projection's forward and backward: its base (bf16 or NF4), LoRA, DoRA
//   decoder_step.cu        the step: the batch, forward, loss, backward, forward_backward, forward_loss
//
// cuda::Decoder: parameters, the memory plan, and the forward, backward and AdamW step on the GPU.
// See decoder.h. The layer code follows src/model/decoder.cpp's layer_forward/layer_backward line
// by line (Gemma2's sandwich norms included); the LoRA projection follows LoraAdapter::forward and
// ::backward, LoRA on lm_head LoraAdapter::fused_output_cross_entropy (Impl::loss). Everything runs
// on the default stream but activation offloading's copies (activation_offload.h: a stream of their
// own, ordered by events), ZeRO-3's weight gathers and ZeRO-2's gradient reduce-scatters (the hooks'
// stream, ordered by events: decoder_sharding.cu's "The ZeRO-3 weight slots" and "The ZeRO-2
// gradient slots"); a step has one host synchronisation, at its end (the index-flag check, then the loss's sum and count, which the
// fused loss left on the device: linear_cross_entropy_enqueue), behind a poll of the enqueued
// collectives, so the host enqueues the backward while the device still runs the forward.
#pragma once

#include "model/cuda/decoder.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <sstream>

#include "core/error.h"
#include "core/random_bits.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/document_bounds.h"
#include "kernels/cuda/embedding.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/nf4.h"
#include "kernels/cuda/nf4_gemm.h"
#include "kernels/cuda/rmsnorm.h"
#include "kernels/cuda/rope.h"
#include "model/cuda/activation_offload.h"
#include "model/cuda/dora.h"
#include "model/cuda/lora_dropout.h"
#include "kernels/cpu/nf4.h"  // the CPU quantiser (nf4_codes.cpp, compiled in): the same codes

namespace ktune::cuda {

namespace decoder_internal {

constexpr size_t kAlign = 256;  // DeviceArena's slice alignment
constexpr int64_t kShardMultiple = 64;  // floats: an optimizer shard's size is a multiple (256-byte slices)
inline size_t aligned(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether an NF4 projection (out, in) runs its GEMMs with the dequantisation fused in (nf4_gemm.h)
// under TrainingSetup::nf4_fused_gemm (`fused`): not DoRA's, whose norms read the whole W, and of a
// shape the kernel takes (the same in either orientation: both dims multiples of 64).
inline bool nf4_gemm_fused(bool fused, bool dora, int64_t out, int64_t in) {
  return fused && !dora && nf4_gemm_supports(out, in);
}

// Carves typed slices out of an arena, or (arena == nullptr) only adds up their aligned bytes.
struct Carver {
  DeviceArena* arena = nullptr;
  size_t bytes = 0;
  template <typename T>
  T* take(int64_t n) {
    const size_t b = size_t(std::max<int64_t>(n, 1)) * sizeof(T);
    bytes += aligned(b);
    return arena ? static_cast<T*>(arena->allocate(b)) : nullptr;
  }
};

// Carves typed slices out of one region from `base` on (base == nullptr: only adds up their aligned
// bytes): the phase scratch's overlays, each from the region's start.
struct Overlay {
  char* base = nullptr;
  size_t bytes = 0;
  template <typename T>
  T* take(int64_t n) {
    T* p = base ? reinterpret_cast<T*>(base + bytes) : nullptr;
    bytes += aligned(size_t(std::max<int64_t>(n, 1)) * sizeof(T));
    return p;
  }
};

// y (n) = bf16(x) (decoder_parameters.cu).
void convert_to_bf16(bf16_t* y, const float* x, int64_t n);
// x (n) = value (decoder_parameters.cu).
void fill_bf16(bf16_t* x, int64_t n, float value);

// A projection's operands for one step (built by Impl::lin from the parameters).
struct LinearRef {
  const bf16_t* w;
  float* dw;  // nullptr: frozen base
  const bf16_t *a = nullptr, *b = nullptr;
  float *da = nullptr, *db = nullptr;
  int64_t in, out, r;
  float scale;
  const bf16_t* bias = nullptr;  // (out) or nullptr
  float* dbias = nullptr;        // (out) f32, nullptr: no bias or frozen
  const uint8_t* nf4_codes = nullptr;  // QLoRA: W in NF4 (w is nullptr), dequantised before each use
  const bf16_t* nf4_scales = nullptr;
  float dropout = 0;          // > 0: the adapter reads dropout(x) (this pass trains and LoRA dropout is on)
  uint64_t dropout_seed = 0;  // lora_dropout_seed(lora_seed, key, module) for this pass
  int64_t dropout_first = 0;  // the mask index of x's first element (a slice of rows: first row * in)
  // DoRA (use_dora): the magnitude m (out) and its gradient; what the forward saves for the backward:
  // pre (N, out), the row norms of W + s B A and c = m / norm (out, f32).
  const bf16_t* m = nullptr;
  float* dm = nullptr;
  bf16_t* pre = nullptr;
  float *norm = nullptr, *c = nullptr;
};

}  // namespace decoder_internal

// ---------------------------------------------------------------------------------------------
// Implementation state

struct Decoder::Impl {
  using LinearRef = decoder_internal::LinearRef;
  // A projection: its base weight (out, in), bias (out) if any and, with LoRA, A (r, in) and B (out, r).
  // Indices into params_.
  struct Linear {
    int64_t in = 0, out = 0;
    int weight = -1, bias = -1, lora_a = -1, lora_b = -1;
    std::string module;  // HF module name ("model.layers.0.self_attn.q_proj"): the dropout masks' key
    int magnitude = -1;  // DoRA: lora_magnitude_vector (out)
    bf16_t* dora_pre = nullptr;  // DoRA, saved by the forward: (N, out) pre-scale output
    float *dora_norm = nullptr, *dora_scale = nullptr;  // (out) ‖W + s B A‖ per row, m / that
  };
  // The norms as the CPU Decoder::Layer names them: norm_attn = input_layernorm; norm_mlp =
  // post_attention_layernorm (gemma2: pre_feedforward_layernorm); gemma2 only: norm_attn_out =
  // post_attention_layernorm (on the attention output), norm_mlp_out = post_feedforward_layernorm.
  struct Layer {
    Linear proj[kNumProjections];
    int norm_attn = -1, norm_mlp = -1, norm_attn_out = -1, norm_mlp_out = -1;
    // The kernels of this layer's attention: TrainingSetup::attention where it takes the layer;
    // kTensorCore on a head_dim other than 64/128 runs the GEMM path.
    TrainingSetup::Attention kernel = TrainingSetup::Attention::kFlash;
    AttentionShape attention{};   // this layer's window, soft-cap and scale
  };
  // What one layer's forward saves for its backward (bf16 unless noted). N = B*T.
  struct Acts {
    bf16_t* ln1 = nullptr;    // (N, C)
    float* rstd1 = nullptr;   // (N) f32
    bf16_t* q = nullptr;      // (N, Hq*D) after rope
    bf16_t* k = nullptr;      // (N, Hkv*D) after rope
    bf16_t* v = nullptr;      // (N, Hkv*D)
    bf16_t* att = nullptr;    // (N, Hq*D)
    float* lse = nullptr;     // (B, Hq, T) f32
    bf16_t* x_mid = nullptr;  // (N, C) residual after attention
    bf16_t* ln2 = nullptr;    // (N, C)
    float* rstd2 = nullptr;   // (N) f32
    bf16_t* gate = nullptr;   // (N, I)
    bf16_t* up = nullptr;     // (N, I)
    bf16_t* act = nullptr;    // (N, I) silu(gate) * up
    bf16_t* xa[kNumProjections] = {};  // (N, r) LoRA x A^T per adapted projection
    // sandwich norms only (gemma2)
    bf16_t* o = nullptr;          // (N, C) o_proj output, input of the post-attention norm
    float* rstd_o = nullptr;      // (N) f32
    bf16_t* down = nullptr;       // (N, C) down_proj output, input of the post-feed-forward norm
    float* rstd_down = nullptr;   // (N) f32
  };

  GemmContext gemm;
  std::unique_ptr<DeviceArena> param_arena, grad_arena, optim_arena, act_arena;
  DeviceBuffer rope_cos, rope_sin;  // (rope_rows, D/2) f32: the CPU RopeTable's
  int64_t rope_rows = 0;             // T_max, more once a packed step's positions reach beyond it
  // Made by allocate(on_device), so that Decoder::plan touches no device (as the GEMM context's handle):
  std::unique_ptr<IndexFlag> index_flag;  // a token id or rotary position out of range, seen by a kernel
  DeviceBuffer loss_totals_at;            // the fused loss's sum and count, read at the step's end
  std::vector<Layer> layers;
  int embed = -1, final_norm = -1, head = -1;  // head == embed when tied
  // The untied head as a projection ("lm_head", (V, C)): with TrainingSetup::lora_on_output its
  // lora_a / lora_b are set and the fused loss runs the low-rank term (loss, head_lora_*).
  Linear output;
  float lora_scale = 0;
  float embed_scale = 1;  // gemma: sqrt(hidden_size) rounded to bf16 (the weights' dtype), as the CPU Decoder
  int64_t ce_chunk = 0;
  // activations: planned for (B_max, T_max); a step runs on (B, T), B <= B_max, T <= T_max
  // (set_step_shape), N = B*T, in the front of every planned buffer
  int64_t B = 0, T = 0, N = 0, B_max = 0, T_max = 0;
  // The layout `positions` holds: 0..positions_T-1 in each of its first positions_B rows (0: none
  // yet, or a packed step's)
  int64_t positions_T = 0, positions_B = 0;
  // L+1 of (N, C): resid[l] layer l's input, resid[L] the final norm's. Offloaded, they all point
  // into offload's two slots (resid[j] in slot j % ActivationOffload::kSlots).
  std::vector<bf16_t*> resid;
  std::vector<Acts> acts;      // L
  bf16_t* final_normed = nullptr;  // (N, C)
  float* final_rstd = nullptr;     // (N)
  int32_t *tokens = nullptr, *labels = nullptr, *positions = nullptr;  // (N)
  int32_t* doc_ids = nullptr;          // (N) a packed step's document ids
  const int32_t* step_docs = nullptr;  // doc_ids during a packed step, else nullptr (causal only)
  // A packed step's DocumentBounds ((N) each: where each token's document starts and ends), so the
  // tiled and fused attention kernels skip key tiles wholly in other documents; {} otherwise.
  int32_t *doc_first_key = nullptr, *doc_last_query = nullptr;
  DocumentBounds step_bounds;
  std::vector<int32_t> host_first_key, host_last_query;
  HostDocumentBounds step_host_bounds;  // the same on the host, for the GEMM attention's shapes; {} otherwise
  // backward scratch
  bf16_t *dres = nullptr, *dtmp = nullptr, *dln = nullptr;       // (N, C)
  // shard_gradients: the two layer gradient slots (layer l's gradients written into slot l % 2,
  // zeroed before each layer's backward writes them), and the gradient reduce's channels: each of the
  // two slots and the whole units 0 and L + 1 (channel_of; one channel when they share their buffer,
  // whole_units_shared: an untied head), with its events (ready: recorded on the
  // default stream behind the unit's backward; reduced: recorded by the hook on its stream behind the
  // reduce-scatter) and the unit whose reduce-scatter it has enqueued and whose piece is not yet in
  // the accumulator (-1: none). "The ZeRO-2 gradient slots" (decoder_sharding.cu) says who waits on whom.
  static constexpr int kGradSlots = 2, kReduceChannels = kGradSlots + 2;
  float* grad_slot[kGradSlots] = {};
  size_t grad_slot_bytes = 0;
  cudaEvent_t grad_ready[kReduceChannels] = {}, grad_reduced[kReduceChannels] = {};
  int64_t reducing[kReduceChannels] = {-1, -1, -1, -1};
  const std::vector<Decoder::GradientUnit>* grad_units = nullptr;  // nullptr: the gradients not sharded
  bool whole_units_shared = false;  // units 0 and L + 1 in one buffer (an untied head; see decoder.h)
  const Decoder::GradientReduce* gradient_reduce = nullptr;
  float* grad_accumulator = nullptr;  // OptimizerShard::grad
  int64_t grad_shard = 0;
  bool reducing_units = false;  // inside forward_backward with shard_gradients (not forward_loss)
  int channel_of(int64_t unit) const;
  void reduce_unit(int64_t unit);
  void settle(int channel);
  void settle_all();
  void forget_reduces() { std::fill(std::begin(reducing), std::end(reducing), int64_t(-1)); }
  // shard_weights: the two weight slots (layer l's weights gathered into slot l % weight_slots; one
  // slot, and no prefetch, without TrainingSetup::prefetch_weights), the
  // layer each holds (-1: none, or stale after an update) and its events (ready: recorded on the
  // default stream behind the slot's own piece; gathered: recorded by the gather hook on its stream
  // behind the gather), Decoder::weight_units_, the gather hook and this rank's shard. "The ZeRO-3
  // weight slots" (decoder_sharding.cu) says which stream runs what and who waits on whom.
  static constexpr int kWeightSlots = 2;  // at most: TrainingSetup::prefetch_weights off uses one
  int weight_slots = kWeightSlots;
  bf16_t* weight_slot[kWeightSlots] = {};
  int64_t slot_layer[kWeightSlots] = {-1, -1};
  cudaEvent_t slot_ready[kWeightSlots] = {}, slot_gathered[kWeightSlots] = {};
  const std::vector<Decoder::WeightUnit>* weight_units = nullptr;  // nullptr: nothing sharded
  const Decoder::WeightGather* weight_gather = nullptr;
  int64_t weight_shard = 0;
  bool sharded_weights() const { return weight_units != nullptr; }
  int slot_of(int64_t layer) const { return int(layer % weight_slots); }
  bool prefetching() const { return weight_slots > 1; }
  void prefetch_weights(int64_t layer);
  void use_weights(int64_t layer);
  void wait_for_collectives();
  void forget_slots() { std::fill(std::begin(slot_layer), std::end(slot_layer), int64_t(-1)); }
  float* dnormed = nullptr;  // (N, C) f32 from the loss, in dres's and dln's bytes (read before either is written)
  bf16_t *datt = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr;
  bf16_t* lora_g = nullptr;                                      // (N, r); LoRA on lm_head: the loss's dxa
  bf16_t* head_xa = nullptr;  // LoRA on lm_head: (N, r) dropout(final_normed) A^T, read by the loss
  bf16_t* head_weight = nullptr;  // QLoRA on lm_head: (head_rows, C) a block of W's rows dequantised, in the fused loss
  int64_t head_rows = 0;          // lm_head's vocabulary rows per block (TrainingSetup::head_block_rows)
  bf16_t* head_dropped = nullptr;  // DoRA on lm_head with dropout: (N, C) x' = dropout(final_normed), through the loss
  float* head_ddropped = nullptr;  // and (N, C) f32 its gradient
  bf16_t* ones = nullptr;  // (N) 1s when a bias trains: db (1, out) += ones (1, N) @ dy (N, out)
  bf16_t* nf4_weight = nullptr;  // QLoRA: the largest NF4 weight that goes through scratch, in bf16
  bool nf4_fused = false;        // TrainingSetup::nf4_fused_gemm
  bf16_t* dropped_x = nullptr;   // LoRA dropout: (N, largest adapted in) dropout(x), then its gradient
  float* dora_w = nullptr;       // DoRA: the largest adapted W + s B A (out * in) in f32
  bf16_t* dora_d = nullptr;      // DoRA: (N, largest adapted out) dy ⊙ c, then dy ⊙ (c - 1)
  bf16_t* dora_p1 = nullptr;     // DoRA with dropout: (N, largest adapted out) x' W^T
  uint64_t dropout_key = 0, lora_seed = 0;
  float dropout_p = 0;
  bool dropping = false;  // this pass applies LoRA dropout (forward_backward with lora_dropout > 0)
  bool checkpointing = false;  // TrainingSetup::activation_checkpointing: acts[l] all alias one layer's,
                               // which the loss's scratch overwrites (the last layer's is recomputed too)
  bool offloading = false;     // TrainingSetup::activation_offloading: resid[0 .. L] in offload's slots
  // The MLP's rows at a time: with checkpointing, chunks of mlp_rows tokens (gate, up and act hold
  // one chunk, (mlp_rows, I); the backward runs each chunk's forward again just before its
  // backward); without, all N at once (mlp_chunked false, mlp_rows = N).
  bool mlp_chunked = false;
  int64_t mlp_rows = 0;
  float* attn_scratch = nullptr;     // kFlash: the backward's rowsums
  float* attn_tc_scratch = nullptr;  // kTensorCore: the backward's delta and f32 dq
  void* attn_gemm_scratch = nullptr;  // kGemm: one head's scores, both directions
  void* ce_scratch = nullptr;  // the loss's scratch, over the loss block (buffers idle during the loss)
  size_t ce_scratch_bytes = 0;
  // profiling: event pairs (start, stop) per timed region; [0] the step, [1] the loss, then attention
  bool profiling = false;
  std::vector<cudaEvent_t> events;
  void mark(size_t i) {
    if (profiling) KTUNE_CUDA_CHECK(cudaEventRecord(events[i], nullptr));
  }
  float between(size_t a, size_t b) const {
    float ms = 0;
    KTUNE_CUDA_CHECK(cudaEventElapsedTime(&ms, events[a], events[b]));
    return ms;
  }
  // Activation offloading's slots, host memory and copy stream (declared after the arenas: it
  // finishes its copies before the slots' arena goes).
  ActivationOffload offload;
  ~Impl() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    for (int k = 0; k < kWeightSlots; ++k) {
      if (slot_ready[k]) cudaEventDestroy(slot_ready[k]);
      if (slot_gathered[k]) cudaEventDestroy(slot_gathered[k]);
    }
    for (int k = 0; k < kReduceChannels; ++k) {
      if (grad_ready[k]) cudaEventDestroy(grad_ready[k]);
      if (grad_reduced[k]) cudaEventDestroy(grad_reduced[k]);
    }
  }

  // The step's pieces (decoder_linear.cu, decoder_step.cu): params points at Decoder::params_.
  std::vector<DeviceParameter>* params = nullptr;
  int64_t lora_rank = 0;
  DeviceParameter& P(int i) { return (*params)[size_t(i)]; }
  LinearRef lin(const Linear& l);
  const bf16_t* base_weight(const LinearRef& w);  // w.w, or the NF4 weight dequantised into nf4_weight
  bool fused_nf4(const LinearRef& w) const;       // an NF4 w whose GEMMs dequantise inside (nf4_gemm.h)
  void base_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, float beta);
  void base_backward_input(bf16_t* dx, const bf16_t* dy, const LinearRef& w, float beta);
  void linear_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta);
  void dora_norms(const LinearRef& w, const bf16_t* weight);  // w.norm, w.c from W + s B A
  void dora_norm_rows(const LinearRef& w, const bf16_t* rows, int64_t o0, int64_t n);  // rows [o0, o0 + n) only
  void dora_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta);
  void dora_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x, const LinearRef& w,
                     const bf16_t* xa);
  void linear_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x, const LinearRef& w,
                       const bf16_t* xa);
  // Construction (decoder.cu, Decoder::allocate): the planned step's shape, each layer's attention
  // kernel and what the activations' scratch must hold; then the activation arena's layout, run to
  // count (a Carver without an arena) and to carve, with the phase scratch's three overlays.
  struct ActivationNeeds;
  ActivationNeeds plan_step(const DecoderConfig& c, const TrainingSetup& setup, int64_t nf4_largest_weight,
                            const std::vector<bool>& nf4, const std::vector<bool>& trainable);
  void lay_out_activations(const DecoderConfig& c, const TrainingSetup& setup, ActivationNeeds& needs,
                           decoder_internal::Carver& k);
  void lay_out_layer_activations(const DecoderConfig& c, decoder_internal::Carver& k);
  void lay_out_phase_scratch(const DecoderConfig& c, const TrainingSetup& setup, const ActivationNeeds& needs,
                             decoder_internal::Overlay& loss, decoder_internal::Overlay& attention,
                             decoder_internal::Overlay& projection);
  // This step's B and T (0: the planned one): N and every layer's attention shape.
  void set_step_shape(int64_t batch, int64_t seq_len);
  // The step's (B, T) host arrays, after set_step_shape: tokens, labels, and a packed step's positions
  // and doc ids (nullptr: positions 0..T-1 in every row, laid out again only when T changed or a
  // packed step overwrote them; no documents). Grows the rotary table when a position reaches
  // beyond it (as the CPU Decoder).
  void upload_batch(const DecoderConfig& c, const int32_t* tokens_host, const int32_t* labels_host,
                    const int32_t* positions_host, const int32_t* doc_ids_host);
  void build_rope_table(const DecoderConfig& c, int64_t rows);
  // embedding .. final norm, saving what the backward reads; for_backward false (forward_loss): no
  // layer input is offloaded, nothing will read them
  void forward(const DecoderConfig& c, bool for_backward);
  // Layer l from x_in to x_out, saving into acts[l] (its attention timed when profiling). Its two
  // halves: attention_half (x_in .. x_mid and ln2) and mlp_forward (ln2 .. x_out, mlp_rows at a time).
  void layer_forward(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bf16_t* x_out);
  // recompute: checkpointing's second run (its attention timed apart from the forward's)
  void attention_half(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bool recompute);
  void mlp_forward(const DecoderConfig& c, int64_t l, bf16_t* x_out);
  // Rows [first, first + rows) of the MLP: gate, up and act (their first `rows` rows) and x_out's rows.
  void mlp_rows_forward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows, bf16_t* x_out);
  // Rows [first, first + rows) of the MLP's backward, dres's rows to dln's, the weight gradients
  // accumulated; chunked, the rows' forward is run again first (into dln's rows, overwritten after).
  void mlp_rows_backward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows);
  void loss(const DecoderConfig& c, float grad_scale, bool backward);
  StepResult loss_totals(const DecoderConfig& c);
  // LoRA on lm_head around the fused loss: head_xa and the loss's LoraHead before it; dA and
  // dnormed's low-rank term (from dxa in lora_g) after it.
  LoraHead head_lora_forward(const LinearRef& w, bool backward);
  void head_lora_backward(const LinearRef& w);
  // DoRA on lm_head: w.norm, w.c (V) from W + s B A, head_rows vocabulary rows at a time.
  void head_dora_norms(const LinearRef& w);
  void backward(const DecoderConfig& c);  // from dnormed (the loss's gradient) down to the embedding
  std::vector<bool> trainable_below(const DecoderConfig& c);
  void ready_layer_for_backward(const DecoderConfig& c, int64_t l, bool more_below);
  void layer_backward(const DecoderConfig& c, int64_t l, bool need_dx);
  std::vector<bool> attention_backward_ran, attention_recompute_ran;  // per layer, for the profile
  void finish_step(const DecoderConfig& c, bool with_backward, Decoder::StepProfile* profile);

  // N set to a slice's rows while the linear ops (which run on N rows) work on it; restored after.
  struct RowScope {
    Impl& impl;
    int64_t saved;
    RowScope(Impl& s, int64_t rows) : impl(s), saved(s.N) { s.N = rows; }
    ~RowScope() { impl.N = saved; }
  };

  // bias (Nn) in C's dtype, added to every row by cuBLASLt's epilogue; nullptr: none
  void mm(bool ta, bool tb, int64_t M, int64_t Nn, int64_t K, float alpha, const bf16_t* A, const bf16_t* Bm,
          float beta, void* C, DType out, const bf16_t* bias = nullptr) {
    GemmCall g;
    g.trans_a = ta, g.trans_b = tb, g.M = M, g.N = Nn, g.K = K, g.alpha = alpha, g.beta = beta;
    g.A = A, g.B = Bm, g.C = C, g.in = DType::BF16, g.out = out;
    g.bias = bias;
    gemm.run(g);
  }
};

}  // namespace ktune::cuda
