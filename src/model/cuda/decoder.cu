// cuda::Decoder: parameters, the memory plan, and the forward, backward and AdamW step on the GPU.
// See decoder.h. The layer code follows src/model/decoder.cpp's layer_forward/layer_backward line
// by line (Gemma2's sandwich norms included); the LoRA projection follows LoraAdapter::forward and
// ::backward, LoRA on lm_head LoraAdapter::fused_output_cross_entropy (Impl::loss). Everything runs
// on the default stream but activation offloading's copies (activation_offload.h: a stream of their
// own, ordered by events), ZeRO-3's weight gathers and ZeRO-2's gradient reduce-scatters (the hooks'
// stream, ordered by events: "The ZeRO-3 weight slots", "The ZeRO-2 gradient slots"); a step has
// one host synchronisation, at its end (the index-flag check, then the loss's sum and count, which the
// fused loss left on the device: linear_cross_entropy_enqueue), behind a poll of the enqueued
// collectives, so the host enqueues the backward while the device still runs the forward.
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

namespace {

constexpr size_t kAlign = 256;  // DeviceArena's slice alignment
constexpr int64_t kDefaultLossChunkTokens = 512;  // TrainingSetup::ce_chunk_tokens = 0
constexpr int64_t kDefaultHeadBlockRows = 4096;   // TrainingSetup::head_block_rows = 0
constexpr int64_t kDefaultMlpChunkTokens = 2048;  // TrainingSetup::mlp_chunk_tokens = 0
constexpr int64_t kShardMultiple = 64;  // floats: an optimizer shard's size is a multiple (256-byte slices)
size_t aligned(size_t bytes) { return (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign; }

// Whether an NF4 projection (out, in) runs its GEMMs with the dequantisation fused in (nf4_gemm.h)
// under TrainingSetup::nf4_fused_gemm (`fused`): not DoRA's, whose norms read the whole W, and of a
// shape the kernel takes (the same in either orientation: both dims multiples of 64).
bool nf4_gemm_fused(bool fused, bool dora, int64_t out, int64_t in) {
  return fused && !dora && nf4_gemm_supports(out, in);
}
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// shard_gradients: whether the whole gradient units 0 (the embedding) and L + 1 (the final norm, the
// head) share one buffer: when the head is untied, so that nothing writes unit 0 before the
// embedding's backward, the last kernel of the backward (decoder.h, TrainingSetup::shard_gradients).
bool whole_units_shared(const DecoderConfig& c) { return !c.tie_word_embeddings; }

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

// ---- small elementwise kernels the step needs between the library ops ----

// y += x (bf16, added in f32, rounded once): the residual's gradient.
__global__ void add_inplace_kernel(__nv_bfloat16* y, const __nv_bfloat16* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16* y, const float* x, int64_t n) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = __float2bfloat16_rn(x[i]);
}

// x[i] = bf16(uniform(-bound, bound)) from (key, first + i); bound == 0 fills with `fill`. first: the
// index of x[0] in the whole tensor (an NF4 lm_head is drawn a block of rows at a time).
__global__ void init_kernel(__nv_bfloat16* x, int64_t n, uint64_t key, float bound, float fill, int64_t first) {
  int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (bound == 0.0f) {
    x[i] = __float2bfloat16_rn(fill);
    return;
  }
  const uint64_t bits = splitmix64(key ^ (uint64_t(first + i) * 0xd1342543de82ef95ull));
  const float u = float(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
  x[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * bound);
}

void add_inplace(bf16_t* y, const bf16_t* x, int64_t n) {
  add_inplace_kernel<<<blocks_for(n, 256), 256>>>(dev(y), dev(x), n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

void convert_to_bf16(bf16_t* y, const float* x, int64_t n) {
  f32_to_bf16_kernel<<<blocks_for(n, 256), 256>>>(dev(y), x, n);
  KTUNE_CUDA_CHECK_LAUNCH();
}

std::string gib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f GiB", double(bytes) / double(1ull << 30));
  return buf;
}

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

// w for the rows of x from `first` on (a slice of the micro-batch): DoRA's saved pre-activations and
// LoRA dropout's mask indices move with the rows.
LinearRef rows_from(LinearRef w, int64_t first) {
  if (w.pre) w.pre += first * w.out;
  w.dropout_first = first * w.in;
  return w;
}

// p + n, or nullptr for nullptr (an optional buffer, offset to a slice of rows).
template <typename T>
T* offset(T* p, int64_t n) {
  return p ? p + n : nullptr;
}

// x (numel) quantised on the host (the CPU quantiser, in bf16 arithmetic: torchao's NF4 of a bf16
// model, as the GPU step trains): codes (numel / 2) bytes, scales (numel / 64) f32, each a bf16 value.
struct Nf4OnHost {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};

// The scales as the device holds them: bf16, each exactly its f32 value (the bf16 arithmetic's
// q / factor + mean is rounded to bf16); refused otherwise, as a scale the device would change.
std::vector<bf16_t> scales_as_bf16(const std::vector<float>& scales) {
  std::vector<bf16_t> held(scales.size());
  for (size_t i = 0; i < scales.size(); ++i) {
    held[i] = ktune::f32_to_bf16(scales[i]);
    const float back = ktune::bf16_to_f32(held[i]);
    check(back == scales[i] || (std::isnan(back) && std::isnan(scales[i])), "cuda decoder: NF4",
          "block scale " + std::to_string(i) + " is not a bf16 value");
  }
  return held;
}
Nf4OnHost quantize_on_host(const float* x, int64_t numel) {
  Nf4OnHost q{std::vector<uint8_t>(size_t(numel / 2)), std::vector<float>(size_t(numel / cpu::kNf4BlockSize))};
  cpu::nf4_quantize(q.codes.data(), q.scales.data(), x, numel, cpu::Nf4Arithmetic::kBf16);
  return q;
}

// The whole of q into codes and scales on the device (p's own, or its layer's slot).
void copy_nf4_to_device(uint8_t* codes, bf16_t* scales, const Nf4OnHost& q) {
  copy_to_device(codes, q.codes.data(), q.codes.size());
  const std::vector<bf16_t> held = scales_as_bf16(q.scales);
  copy_to_device(scales, held.data(), held.size() * sizeof(bf16_t));
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
// Implementation state

struct Decoder::Impl {
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
  IndexFlag flag;
  DeviceBuffer loss_totals_at{linear_cross_entropy_totals_bytes()};  // the fused loss's sum and count, read at the step's end
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
  // the accumulator (-1: none). "The ZeRO-2 gradient slots" below says who waits on whom.
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
  // weight slots" below says which stream runs what and who waits on whom.
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
  bool checkpointing = false;  // TrainingSetup::activation_checkpointing: acts[l] all alias one layer's
  bool offloading = false;     // TrainingSetup::activation_offloading: resid[0 .. L] in offload's slots
  // The MLP's rows at a time: with checkpointing, chunks of mlp_rows tokens (gate, up and act hold
  // one chunk, (mlp_rows, I); the backward runs each chunk's forward again just before its
  // backward); without, all N at once (mlp_chunked false, mlp_rows = N).
  bool mlp_chunked = false;
  int64_t mlp_rows = 0;
  float* attn_scratch = nullptr;     // kFlash: the backward's rowsums
  float* attn_tc_scratch = nullptr;  // kTensorCore: the backward's delta and f32 dq
  void* attn_gemm_scratch = nullptr;  // kGemm: one head's scores, both directions
  void* ce_scratch = nullptr;
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

  // The step's pieces (decoder.cu, "The step"): params points at Decoder::params_.
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

// ---------------------------------------------------------------------------------------------
// Construction: parameters, arenas

namespace {

// Refuses a plan larger than the device's free memory (less 64 MiB for cuBLASLt's workspace and the
// rotary table) before any arena is allocated (Decoder::allocate, once sized): what it holds, and
// what would shrink it.
void refuse_if_larger_than_free_memory(const Decoder::MemoryPlan& plan, const TrainingSetup& setup) {
  size_t used = 0, total = 0;
  device_memory_info(&used, &total);
  const size_t free_bytes = total - std::min(used, total), margin = size_t(64) << 20;
  if (plan.total() + margin <= free_bytes) return;
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

void Decoder::allocate(bool on_device) {
  const DecoderConfig& c = config_;
  Impl& s = *impl_;
  const int64_t C = c.hidden_size, I = c.intermediate_size, QD = c.num_heads * c.head_dim,
                KD = c.num_kv_heads * c.head_dim, L = c.num_layers, V = c.vocab_size;
  const int64_t r = setup_.lora_rank;
  s.lora_scale = r > 0 ? setup_.lora_alpha / float(r) : 0.0f;
  s.lora_rank = r;
  s.params = &params_;
  s.dropout_p = setup_.lora_dropout;
  s.lora_seed = setup_.lora_seed;
  s.checkpointing = setup_.activation_checkpointing;
  s.nf4_fused = setup_.nf4_fused_gemm;
  s.offloading = setup_.activation_offloading;

  // Parameter metadata in HF order, then the LoRA matrices in PEFT's names.
  std::vector<bool> trainable;
  std::vector<int64_t> unit_of;   // each parameter's gradient unit (shard_gradients: 0, 1 + layer, L + 1)
  std::vector<int64_t> layer_of;  // the layer a base parameter belongs to (-1: none, or a LoRA matrix)
  int64_t unit = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool train) {
    DeviceParameter p;
    p.name = name;
    p.numel = 1;
    for (int64_t d : shape) p.numel *= d;
    p.shape = std::move(shape);
    params_.push_back(std::move(p));
    trainable.push_back(train);
    unit_of.push_back(setup_.shard_gradients ? unit : 0);
    layer_of.push_back(unit >= 1 && unit <= L ? unit - 1 : -1);  // the LoRA matrices come after unit L + 1's
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
  if (r > 0) {
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
  s.head_rows = std::min(V, setup_.head_block_rows > 0 ? setup_.head_block_rows : kDefaultHeadBlockRows);
  std::vector<bool> nf4(params_.size(), false);
  int64_t nf4_largest = 0;
  if (setup_.quantize_base) {
    std::vector<const Impl::Linear*> quantized = {&s.output};  // lm_head's W too when it carries LoRA
    for (const Impl::Layer& layer : s.layers)
      for (const Impl::Linear& lin : layer.proj) quantized.push_back(&lin);
    for (const Impl::Linear* lin : quantized) {
      if (lin->lora_a < 0 && (lin == &s.output || !setup_.quantize_unadapted)) continue;
      const DeviceParameter& w = params_[size_t(lin->weight)];
      check(w.numel % cpu::kNf4BlockSize == 0, "cuda decoder: parameter " + w.name,
            "QLoRA needs out*in divisible by 64 (NF4 blocks), got " + std::to_string(w.numel));
      nf4[size_t(lin->weight)] = true;
      // Through the scratch unless the fused GEMM takes it (a layer's projection without DoRA);
      // lm_head's a block of head_rows vocabulary rows at a time.
      const bool fused = lin != &s.output &&
                         nf4_gemm_fused(setup_.nf4_fused_gemm, lin->magnitude >= 0, w.shape[0], w.shape[1]);
      if (!fused) nf4_largest = std::max(nf4_largest, lin == &s.output ? s.head_rows * C : w.numel);
    }
    check(s.output.lora_a < 0 || s.head_rows * C % cpu::kNf4BlockSize == 0, "cuda decoder: lm_head",
          "QLoRA dequantises lm_head in blocks of head_block_rows rows: rows * hidden_size must be a multiple of 64, "
          "got " + std::to_string(s.head_rows) + " * " + std::to_string(C));
  }

  // Parameters, gradients, optimizer state: sized, then carved.
  // The gradient units (one, the whole buffer, without shard_gradients): each parameter's gradient at
  // an aligned offset in its unit, each unit padded to whole shards of 64-float multiples.
  const int64_t shards = setup_.optimizer_shards, rank = setup_.optimizer_shard;
  const int64_t n_units = setup_.shard_gradients ? L + 2 : 1;
  std::vector<int64_t> unit_floats(size_t(n_units), 0), offset_in_unit(params_.size(), 0);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!trainable[i]) continue;
    offset_in_unit[i] = unit_floats[size_t(unit_of[i])];
    unit_floats[size_t(unit_of[i])] += int64_t(aligned(size_t(params_[i].numel) * 4) / 4);
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
  // The arena: the one buffer (the shard a slice of it), or the shard's accumulators, units 0 and
  // L + 1 whole and the two layer slots (each the largest layer unit).
  size_t gbytes = 0;
  size_t grad_slot_bytes = 0;
  if (setup_.shard_gradients) {
    plan_bytes_.grad_accumulators = aligned(size_t(shard_.size) * 4);
    const size_t embedding_unit = aligned(size_t(units_[0].size) * 4),
                 top_unit = aligned(size_t(units_[size_t(L + 1)].size) * 4);
    plan_bytes_.grad_whole_units = whole_units_shared(c) ? std::max(embedding_unit, top_unit) : embedding_unit + top_unit;
    for (int64_t l = 0; l < L; ++l)
      grad_slot_bytes = std::max(grad_slot_bytes, aligned(size_t(units_[size_t(1 + l)].size) * 4));
    plan_bytes_.grad_layer_slots = Impl::kGradSlots * grad_slot_bytes;
    gbytes = plan_bytes_.grad_accumulators + plan_bytes_.grad_whole_units + plan_bytes_.grad_layer_slots;
  } else {
    shard_.begin = rank * units_[0].piece;
    gbytes = size_t(units_[0].size) * 4;
  }
  const size_t obytes = 2 * aligned(size_t(shard_.size) * 2);
  // The parameters: each whole (bf16, or NF4 codes and scales), except with shard_weights the layers'
  // sharded ones: this rank's piece of each layer's weight unit and the two weight slots, each as large
  // as the largest unit (one holds the layer that computes, the other takes the next layer's gather).
  // QLoRA's layer NF4 codes and scales are in the units like the bf16 weights; lm_head's stay whole.
  std::vector<int64_t> nf4_scales_offset;
  const std::vector<int64_t> weight_offset =
      weight_unit_layout(layer_of, trainable, nf4, offset_in_unit, &nf4_scales_offset);
  auto layer_weight_sharded = [&](size_t i) { return weight_offset[i] >= 0; };
  size_t pbytes = 0, nf4_bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const size_t n = size_t(params_[i].numel);
    if (layer_weight_sharded(i)) continue;
    if (nf4[i]) nf4_bytes += aligned(n / 2) + aligned(n / size_t(cpu::kNf4BlockSize) * sizeof(bf16_t));
    else pbytes += aligned(n * 2);
  }
  pbytes += nf4_bytes;
  size_t slot_bytes = 0;
  for (const WeightUnit& unit_l : weight_units_) {
    plan_bytes_.weight_pieces += aligned(size_t(unit_l.piece) * 2);
    slot_bytes = std::max(slot_bytes, aligned(size_t(unit_l.size) * 2));
  }
  const int weight_slots = setup_.prefetch_weights ? Impl::kWeightSlots : 1;  // one: no prefetch
  plan_bytes_.weight_slots = size_t(weight_slots) * slot_bytes;
  pbytes += plan_bytes_.weight_pieces + plan_bytes_.weight_slots;
  // Activations: one layout function, run to count and then to carve.
  s.B = s.B_max = setup_.batch;
  s.T = s.T_max = setup_.seq_len;
  s.N = s.B * s.T;
  s.mlp_chunked = setup_.activation_checkpointing;
  s.mlp_rows = s.mlp_chunked ? std::min(s.N, setup_.mlp_chunk_tokens > 0 ? setup_.mlp_chunk_tokens
                                                                          : kDefaultMlpChunkTokens)
                             : s.N;
  const int64_t N = s.N;
  s.ce_chunk = setup_.ce_chunk_tokens > 0 ? setup_.ce_chunk_tokens : kDefaultLossChunkTokens;
  if (s.ce_chunk > 128) s.ce_chunk = s.ce_chunk / 128 * 128;
  s.ce_chunk = std::min(s.ce_chunk, N);
  const bool head_dora = s.output.magnitude >= 0;  // DoRA on lm_head
  const bool head_dora_dropout = head_dora && setup_.lora_dropout > 0;
  s.ce_scratch_bytes = linear_cross_entropy_scratch_bytes(s.ce_chunk, V, head_dora_dropout);
  AttentionShape ashape{s.B, s.T, c.num_heads, c.num_kv_heads, c.head_dim, 1.0f, 0, 0.0f};
  // Each layer's attention: a window reaching back over the whole row (>= T) masks nothing and is
  // dropped; what remains of a window, and a soft-cap, run on whichever path the layer takes (the
  // fused tensor-core kernel has both; kTensorCore falls back to kGemm only for a head_dim it lacks).
  const float attention_scale = c.attention_scale > 0 ? c.attention_scale : 1.0f / std::sqrt(float(c.head_dim));
  bool any_gemm_attention = false, any_flash_attention = false, any_tc_attention = false;
  for (int64_t l = 0; l < L; ++l) {
    Impl::Layer& layer = s.layers[size_t(l)];
    const int64_t window = c.window(l) >= s.T ? 0 : c.window(l);
    layer.attention = AttentionShape{s.B, s.T, c.num_heads, c.num_kv_heads, c.head_dim, attention_scale, window,
                                     c.attn_logit_softcap};
    using A = TrainingSetup::Attention;
    layer.kernel = setup_.attention == A::kFlash ? A::kFlash : A::kGemm;
    if (setup_.attention == A::kTensorCore && flash_attention_tc_supports(layer.attention))
      layer.kernel = A::kTensorCore;
    any_gemm_attention |= layer.kernel == A::kGemm;
    any_flash_attention |= layer.kernel == A::kFlash;
    any_tc_attention |= layer.kernel == A::kTensorCore;
  }
  // the widest input an adapter reads (LoRA dropout's scratch rows; lm_head's is C)
  int64_t lora_in_largest = s.output.lora_a >= 0 ? C : 0;
  const bool head_nf4 = s.output.lora_a >= 0 && nf4[size_t(s.output.weight)];  // QLoRA on lm_head
  // DoRA's scratch (lm_head's norms: a block of head_rows rows of W + s B A in f32)
  int64_t dora_weight_largest = head_dora ? s.head_rows * C : 0, dora_out_largest = 0;
  for (const Impl::Layer& layer : s.layers)
    for (const Impl::Linear& lin : layer.proj) {
      if (lin.lora_a >= 0) lora_in_largest = std::max(lora_in_largest, lin.in);
      if (lin.magnitude >= 0) {
        dora_weight_largest = std::max(dora_weight_largest, lin.in * lin.out);
        dora_out_largest = std::max(dora_out_largest, lin.out);
      }
    }
  bool any_bias_grad = false;
  for (const Impl::Layer& layer : s.layers)
    for (const Impl::Linear& lin : layer.proj) any_bias_grad |= lin.bias >= 0 && trainable[size_t(lin.bias)];
  std::vector<bf16_t*> offload_slots;  // activation offloading's device slots (layout fills them)
  size_t loss_bytes = 0;               // the loss's phase scratch (layout sets it)
  auto layout = [&](Carver& k) {
    s.resid.assign(size_t(L + 1), nullptr);
    if (s.offloading) {  // the L + 1 share the two slots: resid[j] in slot j % kSlots
      offload_slots.assign(size_t(ActivationOffload::slot_count(L + 1)), nullptr);
      for (auto& x : offload_slots) x = k.take<bf16_t>(N * C);
      for (int64_t j = 0; j <= L; ++j) s.resid[size_t(j)] = offload_slots[size_t(j % ActivationOffload::kSlots)];
    } else {
      for (auto& x : s.resid) x = k.take<bf16_t>(N * C);
    }
    // Every layer's saved activations; with activation checkpointing, one layer's that all share
    // (each layer's forward is run again into them before its backward), the residual stream above
    // being what is kept per layer.
    s.acts.assign(size_t(L), Impl::Acts{});
    for (int64_t l = 0; l < L; ++l) {
      Impl::Acts& a = s.acts[size_t(l)];
      if (s.checkpointing && l > 0) {
        a = s.acts[0];
        for (int p = 0; p < kNumProjections; ++p) {
          const Impl::Linear& first = s.layers[0].proj[p];
          Impl::Linear& lin = s.layers[size_t(l)].proj[p];
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
      a.gate = k.take<bf16_t>(s.mlp_rows * I);  // (mlp_rows, I): all N rows unless checkpointing chunks them
      a.up = k.take<bf16_t>(s.mlp_rows * I);
      a.act = k.take<bf16_t>(s.mlp_rows * I);
      for (int p = 0; p < kNumProjections; ++p)
        a.xa[p] = s.layers[size_t(l)].proj[p].lora_a >= 0 ? k.take<bf16_t>(N * r) : nullptr;
      for (Impl::Linear& lin : s.layers[size_t(l)].proj) {
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
    s.final_rstd = k.take<float>(N);
    s.tokens = k.take<int32_t>(N);
    s.labels = k.take<int32_t>(N);
    s.positions = k.take<int32_t>(N);
    s.doc_ids = k.take<int32_t>(N);
    s.doc_first_key = k.take<int32_t>(N);
    s.doc_last_query = k.take<int32_t>(N);
    // dres and dln back to back, (N, C) bf16 each: the loss's f32 (N, C) gradient before them
    // (the backward's first kernel reads it into dtmp; dres and dln are written after).
    s.dnormed = k.take<float>(N * C);
    s.dres = reinterpret_cast<bf16_t*>(s.dnormed);
    s.dln = s.dres + N * C;
    s.dtmp = k.take<bf16_t>(N * C);
    s.final_normed = s.dtmp;  // the loss reads it; the backward writes dtmp only after the loss
    s.datt = k.take<bf16_t>(N * QD);
    s.dq = k.take<bf16_t>(N * QD);
    s.dk = k.take<bf16_t>(N * KD);
    s.dv = k.take<bf16_t>(N * KD);
    s.lora_g = r > 0 ? k.take<bf16_t>(N * r) : nullptr;
    s.head_xa = s.output.lora_a >= 0 ? k.take<bf16_t>(N * r) : nullptr;
    s.output.dora_norm = head_dora ? k.take<float>(V) : nullptr;  // (V) from before the loss to its end
    s.output.dora_scale = head_dora ? k.take<float>(V) : nullptr;
    s.ones = any_bias_grad ? k.take<bf16_t>(N) : nullptr;
    // Phase scratch: the fused loss's chunk (used by the loss, between the forward and the
    // backward; with QLoRA on lm_head also a block of the head's W dequantised, with DoRA on lm_head
    // and dropout x' and its gradient, all read during the loss), the attention kernels' (inside one
    // layer's attention) and the projections' (inside one linear_forward / linear_backward: the NF4
    // weight dequantised, LoRA dropout's x', DoRA's; LoRA on lm_head uses x' just before the fused
    // loss and just after it, never during it, and DoRA's norms of lm_head just before it).
    // One stream runs them one after another and none reads what another phase left, so the three
    // overlay one region, as large as the largest of them.
    auto phase_scratch = [&](Overlay& loss, Overlay& attention, Overlay& projection) {
      s.ce_scratch = loss.take<char>(int64_t(s.ce_scratch_bytes));
      s.head_weight = head_nf4 ? loss.take<bf16_t>(s.head_rows * C) : nullptr;  // beside the chunk's
      s.head_dropped = head_dora_dropout ? loss.take<bf16_t>(N * C) : nullptr;
      s.head_ddropped = head_dora_dropout ? loss.take<float>(N * C) : nullptr;
      s.attn_scratch =
          any_flash_attention ? attention.take<float>(attention_backward_scratch_floats(ashape)) : nullptr;
      s.attn_tc_scratch =
          any_tc_attention ? attention.take<float>(flash_attention_tc_backward_scratch_floats(ashape)) : nullptr;
      s.attn_gemm_scratch =
          any_gemm_attention ? attention.take<char>(int64_t(attention_gemm_scratch_bytes(ashape))) : nullptr;
      s.nf4_weight = nf4_largest > 0 ? projection.take<bf16_t>(nf4_largest) : nullptr;
      s.dropped_x =
          setup_.lora_dropout > 0 && lora_in_largest > 0 ? projection.take<bf16_t>(N * lora_in_largest) : nullptr;
      s.dora_w = dora_weight_largest > 0 ? projection.take<float>(dora_weight_largest) : nullptr;
      s.dora_d = dora_weight_largest > 0 ? projection.take<bf16_t>(N * dora_out_largest) : nullptr;
      s.dora_p1 = dora_weight_largest > 0 && setup_.lora_dropout > 0 ? projection.take<bf16_t>(N * dora_out_largest)
                                                                     : nullptr;
    };
    Overlay loss, attention, projection;  // sizes first
    phase_scratch(loss, attention, projection);
    loss_bytes = loss.bytes;
    char* phase = k.take<char>(int64_t(std::max({loss.bytes, attention.bytes, projection.bytes})));
    Overlay loss_at{phase}, attention_at{phase}, projection_at{phase};
    phase_scratch(loss_at, attention_at, projection_at);
  };
  Carver count;
  layout(count);

  plan_bytes_.parameters = pbytes;
  plan_bytes_.nf4_base = nf4_bytes;
  plan_bytes_.nf4_scratch = nf4_largest > 0 ? aligned(size_t(nf4_largest) * 2) : 0;
  plan_bytes_.gradients = gbytes;
  plan_bytes_.optimizer = obytes;
  plan_bytes_.activations = count.bytes;
  plan_bytes_.loss_scratch = loss_bytes;
  plan_bytes_.host_offload = s.offloading ? ActivationOffload::host_bytes(L + 1, N * C) : 0;
  if (!on_device) return;
  // Sized: refused here when larger than the device, before any arena is allocated.
  refuse_if_larger_than_free_memory(plan_bytes_, setup_);
  s.param_arena = std::make_unique<DeviceArena>("cuda decoder parameters", pbytes);
  s.grad_arena = std::make_unique<DeviceArena>("cuda decoder gradients", gbytes);
  s.optim_arena = std::make_unique<DeviceArena>("cuda decoder AdamW state", obytes);
  shard_.m = s.optim_arena->allocate_n<bf16_t>(size_t(shard_.size));
  shard_.v = s.optim_arena->allocate_n<bf16_t>(size_t(shard_.size));
  if (setup_.shard_gradients) {
    shard_.grad = s.grad_arena->allocate_n<float>(size_t(shard_.size));
    s.whole_units_shared = whole_units_shared(c);
    if (s.whole_units_shared) {
      units_[0].grads = s.grad_arena->allocate_n<float>(size_t(std::max(units_[0].size, units_[size_t(L + 1)].size)));
      units_[size_t(L + 1)].grads = units_[0].grads;
    } else {
      units_[0].grads = s.grad_arena->allocate_n<float>(size_t(units_[0].size));
      units_[size_t(L + 1)].grads = s.grad_arena->allocate_n<float>(size_t(units_[size_t(L + 1)].size));
    }
    s.grad_slot_bytes = grad_slot_bytes;
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
  } else {
    units_[0].grads = s.grad_arena->allocate_n<float>(size_t(units_[0].size));
    shard_.grad = units_[0].grads + shard_.begin;
  }
  if (setup_.shard_weights) {  // the pieces zeroed: the gaps and the padding between parameters stay 0
    s.weight_slots = weight_slots;
    for (int k = 0; k < s.weight_slots; ++k) {
      s.weight_slot[k] = static_cast<bf16_t*>(s.param_arena->allocate(slot_bytes));
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
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    if (layer_weight_sharded(i)) {  // in its layer's slot, at its place in the layer's weight unit
      p.weight_layer = layer_of[i];
      p.weight_offset = weight_offset[i];
      bf16_t* slot = s.weight_slot[s.slot_of(p.weight_layer)];
      if (nf4[i]) {  // the codes' and the scales' bytes at their places (256-byte aligned)
        p.nf4_scales_offset = nf4_scales_offset[i];
        p.nf4_codes = reinterpret_cast<uint8_t*>(slot + p.weight_offset);
        p.nf4_scales = slot + p.nf4_scales_offset;
      } else {
        p.value = slot + p.weight_offset;
      }
    } else if (nf4[i]) {
      p.nf4_codes = s.param_arena->allocate_n<uint8_t>(size_t(p.numel / 2));
      p.nf4_scales = s.param_arena->allocate_n<bf16_t>(size_t(p.numel / cpu::kNf4BlockSize));
    } else {
      p.value = s.param_arena->allocate_n<bf16_t>(size_t(p.numel));
    }
    if (trainable[i]) {
      // This rank's piece of the unit: layout elements [piece_begin, piece_begin + piece), at
      // unit.shard_offset in the shard's accumulator and moments.
      const GradientUnit& unit_p = units_[size_t(unit_of[i])];
      const int64_t piece_begin = unit_p.begin + rank * unit_p.piece;
      p.unit = unit_of[i];
      p.grad = unit_p.grads + offset_in_unit[i];
      p.grad_offset = unit_p.begin + offset_in_unit[i];
      p.shard_begin = std::clamp<int64_t>(piece_begin - p.grad_offset, 0, p.numel);
      p.shard_end = std::clamp<int64_t>(piece_begin + unit_p.piece - p.grad_offset, 0, p.numel);
      if (p.shard_begin < p.shard_end) {
        const int64_t k = unit_p.shard_offset + (p.grad_offset + p.shard_begin - piece_begin);
        p.m = shard_.m + k;
        p.v = shard_.v + k;
        p.shard_grad = shard_.grad + k;
        // A full fine-tune's weight unit is its gradient unit's layout: the same piece.
        p.shard_value = layer_weight_sharded(i) ? piece_value(p.weight_layer, p.weight_offset + p.shard_begin)
                                                : p.value + p.shard_begin;
      }
    }
  }
  s.act_arena = std::make_unique<DeviceArena>("cuda decoder activations", count.bytes);
  Carver carve{s.act_arena.get()};
  layout(carve);
  if (s.offloading) s.offload.init(L + 1, N * C, offload_slots);
  if (s.ones) {
    init_kernel<<<blocks_for(N, 256), 256>>>(dev(s.ones), N, 0, 0.0f, 1.0f, 0);
    KTUNE_CUDA_CHECK_LAUNCH();
  }
  // Gemma: sqrt(hidden) in the weights' dtype (bf16), as HF's embed_scale.to(weight.dtype).
  s.embed_scale = c.scale_embeddings ? bf16_to_f32(f32_to_bf16(float(std::sqrt(double(C))))) : 1.0f;

  // Positions are laid out by the first step (upload_batch); the rotary table for T_max positions
  // (the CPU RopeTable's angles).
  s.positions_T = s.positions_B = 0;
  s.set_step_shape(s.B_max, s.T_max);
  s.build_rope_table(c, s.T);
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

void Decoder::init_parameters(uint64_t seed) {
  Impl& s = *impl_;
  const float normal_bound = 0.02f * std::sqrt(3.0f);  // uniform with std 0.02
  std::vector<bool> is_norm(params_.size(), false), is_a(params_.size(), false), is_b(params_.size(), false);
  std::vector<bool> is_bias(params_.size(), false);
  for (auto& layer : s.layers) {
    for (int norm : {layer.norm_attn, layer.norm_mlp, layer.norm_attn_out, layer.norm_mlp_out})
      if (norm >= 0) is_norm[size_t(norm)] = true;
    for (auto& lin : layer.proj) {
      if (lin.bias >= 0) is_bias[size_t(lin.bias)] = true;
      if (lin.lora_a >= 0) is_a[size_t(lin.lora_a)] = true;
      if (lin.lora_b >= 0) is_b[size_t(lin.lora_b)] = true;
    }
  }
  is_norm[size_t(s.final_norm)] = true;
  if (s.output.lora_a >= 0) is_a[size_t(s.output.lora_a)] = is_b[size_t(s.output.lora_b)] = true;
  // Parameter i's elements [first, first + n) (n < 0: all of them) drawn into target.
  auto draw = [&](size_t i, bf16_t* target, float bound, float fill, int64_t first = 0, int64_t n = -1) {
    if (n < 0) n = params_[i].numel;
    init_kernel<<<blocks_for(n, 256), 256>>>(dev(target), n, splitmix64(seed ^ splitmix64(i)), bound, fill, first);
    KTUNE_CUDA_CHECK_LAUNCH();
  };
  // An NF4 base's values (host f32): drawn into the dequantisation scratch (lm_head's a block of rows at
  // a time; into a buffer of its own where the fused GEMM left the scratch smaller than the block, or
  // none), to be quantised on the host as an upload.
  auto nf4_drawn = [&](size_t i, float bound, float fill) {
    const DeviceParameter& p = params_[i];
    std::vector<bf16_t> drawn(size_t(p.numel));
    const int64_t block = int(i) == s.output.weight ? s.head_rows * p.shape[1] : p.numel;
    DeviceBuffer own_scratch;
    bf16_t* scratch = s.nf4_weight;
    if (plan_bytes_.nf4_scratch < size_t(block) * sizeof(bf16_t)) {
      own_scratch = DeviceBuffer(size_t(block) * sizeof(bf16_t));
      scratch = own_scratch.as<bf16_t>();
    }
    for (int64_t first = 0; first < p.numel; first += block) {
      const int64_t n = std::min(block, p.numel - first);
      draw(i, scratch, bound, fill, first, n);
      copy_to_host(drawn.data() + first, scratch, size_t(n) * sizeof(bf16_t));  // synchronous
    }
    std::vector<float> x(drawn.size());
    for (size_t j = 0; j < x.size(); ++j) x[j] = bf16_to_f32(drawn[j]);
    return x;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    float bound = normal_bound, fill = 0.0f;
    if (is_norm[i]) bound = 0.0f, fill = 1.0f - config_.norm_weight_offset;  // the identity: (offset + w) = 1
    if (is_bias[i]) bound = 0.0f, fill = 0.0f;
    if (is_a[i]) bound = 1.0f / std::sqrt(float(p.shape[1]));
    if (is_b[i]) bound = 0.0f, fill = 0.0f;
    if (p.nf4_codes) {  // sharded: this rank's piece of the codes and scales only
      const std::vector<float> x = nf4_drawn(i, bound, fill);
      upload_nf4(p, reader_of(x.data()), kUploadChunk);
      continue;
    }
    draw(i, p.value, bound, fill);
    if (weights_sharded(p)) {  // drawn whole into the slot, this rank's elements kept
      const WeightRange mine = weight_piece_range(p.weight_layer, p.weight_offset, p.numel);
      if (mine.begin < mine.end)
        copy_on_device(piece_value(p.weight_layer, p.weight_offset + mine.begin), p.value + mine.begin,
                       size_t(mine.end - mine.begin) * sizeof(bf16_t));
    }
  }
  // DoRA: m starts at the row norms of W (B = 0, so ‖W + s B A‖ = ‖W‖), as PEFT.
  for (const Impl::Layer& layer : s.layers)
    for (const Impl::Linear& lin : layer.proj) {
      if (lin.magnitude < 0) continue;
      // shard_weights: the slot holds another layer's weights now; this W drawn into it again (NF4:
      // drawn, quantised and copied whole into the slot).
      const DeviceParameter& base = params_[size_t(lin.weight)];
      if (weights_sharded(base) && base.nf4_codes)
        copy_nf4_to_device(base.nf4_codes, base.nf4_scales,
                           quantize_on_host(nf4_drawn(size_t(lin.weight), normal_bound, 0.0f).data(), base.numel));
      else if (weights_sharded(base))
        draw(size_t(lin.weight), base.value, normal_bound, 0.0f);
      const LinearRef w = s.lin(lin);
      s.dora_norms(w, s.base_weight(w));
      convert_to_bf16(params_[size_t(lin.magnitude)].value, w.norm, lin.out);
    }
  if (s.output.magnitude >= 0) {
    const LinearRef w = s.lin(s.output);
    s.head_dora_norms(w);
    convert_to_bf16(params_[size_t(s.output.magnitude)].value, w.norm, w.out);
  }
  s.forget_slots();  // the slots hold the last layers' drawn values, not gathered layers
  zero_grad();
  KTUNE_CUDA_CHECK(cudaMemsetAsync(impl_->optim_arena->data(), 0, impl_->optim_arena->used(), nullptr));
  synchronize();
}

// ---------------------------------------------------------------------------------------------
// Parameters by name

DeviceParameter& Decoder::parameter(const std::string& name) {
  for (auto& p : params_)
    if (p.name == name) return p;
  throw Error("cuda decoder: parameter " + name, "no such parameter");
}

int64_t Decoder::parameter_count(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& p : params_)
    if (!trainable_only || p.grad) n += p.numel;
  return n;
}

Decoder::ValueReader Decoder::reader_of(const float* x) {
  return [x](int64_t first, int64_t count, float* out) { std::memcpy(out, x + first, size_t(count) * sizeof(float)); };
}

void Decoder::upload(const std::string& name, const std::vector<float>& values) {
  const DeviceParameter& p = parameter(name);
  check(int64_t(values.size()) == p.numel, "cuda decoder: parameter " + name,
        "upload of " + std::to_string(values.size()) + " values, the parameter has " + std::to_string(p.numel));
  upload_read(name, reader_of(values.data()));
}

void Decoder::upload_bf16(const std::string& name, const bf16_t* values, int64_t numel) {
  DeviceParameter& p = parameter(name);
  check(numel == p.numel, "cuda decoder: parameter " + name,
        "upload of " + std::to_string(numel) + " values, the parameter has " + std::to_string(p.numel));
  if (p.nf4_codes)  // widened exactly: the codes of the values' f32, as upload() makes them
    return upload_read(name, [values](int64_t first, int64_t count, float* out) {
      for (int64_t i = 0; i < count; ++i) out[i] = ktune::bf16_to_f32(values[first + i]);
    });
  store_bf16(p, values);
}

void Decoder::upload_read(const std::string& name, const ValueReader& read, int64_t chunk) {
  const DeviceParameter& p = parameter(name);
  check(chunk >= 1, "cuda decoder: parameter " + name, "an upload reads at least one value at a time");
  if (p.nf4_codes) return upload_nf4(p, read, chunk);
  const bool sharded = weights_sharded(p);  // ZeRO-3: only this rank's piece is read and stored
  const WeightRange mine = sharded ? weight_piece_range(p.weight_layer, p.weight_offset, p.numel) : WeightRange{0, p.numel};
  std::vector<float> wide;
  std::vector<bf16_t> narrow;
  for (int64_t first = mine.begin; first < mine.end; first += chunk) {
    const int64_t n = std::min(chunk, mine.end - first);
    wide.resize(size_t(n));
    narrow.resize(size_t(n));
    read(first, n, wide.data());
    for (int64_t i = 0; i < n; ++i) narrow[size_t(i)] = ktune::f32_to_bf16(wide[size_t(i)]);
    bf16_t* place = sharded ? piece_value(p.weight_layer, p.weight_offset + first) : p.value + first;
    copy_to_device(place, narrow.data(), size_t(n) * sizeof(bf16_t));
  }
  if (sharded) slot_stale(p.weight_layer);
}

void Decoder::store_bf16(const DeviceParameter& p, const bf16_t* host) {
  if (!weights_sharded(p)) {
    copy_to_device(p.value, host, size_t(p.numel) * sizeof(bf16_t));
    return;
  }
  write_piece(p.weight_layer, p.weight_offset, host, p.numel);  // ZeRO-3: this rank's elements
}

void Decoder::upload_nf4(const DeviceParameter& p, const ValueReader& read, int64_t chunk) {
  const int64_t block = cpu::kNf4BlockSize, blocks_a_read = std::max<int64_t>(1, chunk / block);
  const cpu::Nf4Arithmetic bf16 = cpu::Nf4Arithmetic::kBf16;
  Nf4OnHost q{std::vector<uint8_t>(size_t(p.numel / 2)), std::vector<float>(size_t(p.numel / block))};
  std::vector<float> wide;
  // blocks [first, end): their codes into q and their absmax into q.scales, or (codes false) the absmax alone
  auto read_blocks = [&](int64_t first, int64_t end, bool codes) {
    for (int64_t b = first; b < end; b += blocks_a_read) {
      const int64_t n = std::min(blocks_a_read, end - b) * block;
      wide.resize(size_t(n));
      read(b * block, n, wide.data());
      if (codes)
        cpu::nf4_quantize_blocks(q.codes.data() + b * block / 2, q.scales.data() + b, wide.data(), n, bf16);
      else
        cpu::nf4_block_absmax(q.scales.data() + b, wide.data(), n, bf16);
    }
  };
  const int64_t blocks = p.numel / block;
  if (!weights_sharded(p)) {
    read_blocks(0, blocks, true);
    cpu::nf4_double_quantize_scales(q.scales.data(), blocks, bf16);
    return copy_nf4_to_device(p.nf4_codes, p.nf4_scales, q);
  }
  // ZeRO-3: this rank's part of the codes' and the scales' bytes, counted in bf16 elements as the unit
  // is. Only the 64-value blocks whose codes that part holds are quantised (a bf16 element of the codes
  // is 4 values, of block e / 16): 1/W of the quantising on each GPU. Every block's absmax is read: the
  // scales are double quantised over the whole tensor (their mean, and their groups of 256).
  const int64_t code_elements = p.numel / 4, scale_elements = blocks;
  const WeightRange codes = weight_piece_range(p.weight_layer, p.weight_offset, code_elements);
  const int64_t c0 = std::min(codes.begin / 16, blocks), c1 = std::max(c0, std::min((codes.end + 15) / 16, blocks));
  read_blocks(0, c0, false);
  read_blocks(c0, c1, true);
  read_blocks(c1, blocks, false);
  cpu::nf4_double_quantize_scales(q.scales.data(), blocks, bf16);
  write_piece(p.weight_layer, p.weight_offset, q.codes.data(), code_elements);
  write_piece(p.weight_layer, p.nf4_scales_offset, scales_as_bf16(q.scales).data(), scale_elements);
}

void Decoder::write_piece(int64_t layer, int64_t offset, const void* host, int64_t n) {
  const WeightRange mine = weight_piece_range(layer, offset, n);
  if (mine.begin < mine.end)
    copy_to_device(piece_value(layer, offset + mine.begin), static_cast<const bf16_t*>(host) + mine.begin,
                   size_t(mine.end - mine.begin) * sizeof(bf16_t));
  slot_stale(layer);
}

void Decoder::slot_stale(int64_t layer) {
  int64_t& in_slot = impl_->slot_layer[impl_->slot_of(layer)];
  if (in_slot == layer) in_slot = -1;
}

// Layer l's weight unit: a full fine-tune's every layer parameter at its gradient's place in gradient
// unit 1 + l (AdamW's pieces are the gradients' pieces); LoRA's the layer's frozen parameters, each at
// a 256-byte aligned place: a bf16 one's values, an NF4 one's codes (numel / 2 bytes) and then its
// scales (numel / 64 f32). Each unit padded to optimizer_shards * 64 elements.
std::vector<int64_t> Decoder::weight_unit_layout(const std::vector<int64_t>& layer_of,
                                                 const std::vector<bool>& trainable, const std::vector<bool>& nf4,
                                                 const std::vector<int64_t>& offset_in_unit,
                                                 std::vector<int64_t>* nf4_scales_offset) {
  std::vector<int64_t> offset(params_.size(), -1);
  nf4_scales_offset->assign(params_.size(), -1);
  weight_units_.clear();
  if (!setup_.shard_weights) return offset;
  const int64_t shards = setup_.optimizer_shards, L = config_.num_layers;
  weight_units_.assign(size_t(L), WeightUnit{});
  std::vector<int64_t> used(size_t(L), 0);
  auto place = [&](int64_t l, size_t bytes) {  // the next aligned place in layer l's unit, in bf16 elements
    const int64_t at = used[size_t(l)];
    used[size_t(l)] += int64_t(aligned(bytes) / sizeof(bf16_t));
    return at;
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    const int64_t l = layer_of[i];
    const size_t n = size_t(params_[i].numel);
    if (l < 0 || trainable[i] != setup_.full_finetune) continue;
    if (setup_.full_finetune) {
      offset[i] = offset_in_unit[i];
    } else if (nf4[i]) {
      offset[i] = place(l, n / 2);
      (*nf4_scales_offset)[i] = place(l, n / size_t(cpu::kNf4BlockSize) * sizeof(bf16_t));
    } else {
      offset[i] = place(l, n * sizeof(bf16_t));
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    WeightUnit& unit_l = weight_units_[size_t(l)];
    unit_l.size = setup_.full_finetune ? units_[size_t(1 + l)].size
                                       : ceil_div(used[size_t(l)], shards * kShardMultiple) * shards * kShardMultiple;
    unit_l.piece = unit_l.size / shards;
  }
  return offset;
}

Decoder::WeightRange Decoder::weight_piece_range(int64_t layer, int64_t offset, int64_t n) const {
  const int64_t piece = weight_units_[size_t(layer)].piece, first = setup_.optimizer_shard * piece;
  return {std::clamp<int64_t>(first - offset, 0, n), std::clamp<int64_t>(first + piece - offset, 0, n)};
}

bf16_t* Decoder::piece_value(int64_t layer, int64_t element) const {
  const WeightUnit& unit = weight_units_[size_t(layer)];
  return unit.piece_values + (element - setup_.optimizer_shard * unit.piece);
}

void Decoder::gather_weights(int64_t layer) {
  Impl& s = *impl_;
  check(setup_.shard_weights && layer >= 0 && layer < config_.num_layers, "cuda decoder",
        "gather_weights(" + std::to_string(layer) + "): only the layers' weights are sharded (shard_weights)");
  s.use_weights(layer);
  s.wait_for_collectives();
}

// ---- The ZeRO-3 weight slots (shard_weights) ----
// Two streams touch a slot: the DEFAULT stream (this rank's piece copied into the slot, then the
// layer's kernels that read it) and the gather hook's own stream (the all-gather of the other ranks'
// pieces into it, WeightGather::enqueue). Who waits on whom, for slot k:
//   - the gather into slot k waits (on its stream) for slot_ready[k], recorded on the default stream
//     right behind the own piece's copy; in issue order that is also behind every kernel that read
//     the slot's previous layer (the layer two before in the forward, two after in the backward);
//   - the default stream waits for slot_gathered[k] (recorded behind the gather on the hook's
//     stream) before the first kernel of a layer that reads slot k (use_weights), and before it
//     copies a new piece into slot k (the previous gather into k may not have landed when nothing
//     read it yet).
// With one slot (TrainingSetup::prefetch_weights off) nothing is prefetched: use_weights gathers each
// layer into slot 0 behind the previous layer's kernels, the same events ordering it.
// No host synchronisation: the host enqueues and goes on. wait_for_collectives polls the hook
// (WeightGather::wait_all) before each host synchronisation of a step, so a dead peer ends in the
// collective's Error there, not in a hang inside cudaDeviceSynchronize.

// Layer `layer`'s gather into its slot enqueued behind the default stream's work so far (the layer's
// weights are needed soon: the next layer's forward, the previous layer's backward); nothing when
// the slot holds that layer already.
void Decoder::Impl::prefetch_weights(int64_t layer) {
  const int k = slot_of(layer);
  if (slot_layer[k] == layer) return;
  check(bool(weight_gather->enqueue) && bool(weight_gather->wait_all), "cuda decoder",
        "shard_weights: no weight gather set (set_weight_gather)");
  const Decoder::WeightUnit& unit = (*weight_units)[size_t(layer)];
  KTUNE_CUDA_CHECK(cudaStreamWaitEvent(nullptr, slot_gathered[k], 0));  // the slot's previous gather has landed
  copy_on_device(weight_slot[k] + weight_shard * unit.piece, unit.piece_values, size_t(unit.piece) * sizeof(bf16_t));
  KTUNE_CUDA_CHECK(cudaEventRecord(slot_ready[k], nullptr));
  slot_layer[k] = -1;  // while the hook runs (a throw leaves no layer in the slot)
  weight_gather->enqueue(layer, weight_slot[k], slot_ready[k], slot_gathered[k]);
  slot_layer[k] = layer;
}

// Layer `layer`'s weights for the default stream's next kernels: gathered into its slot if no
// prefetch brought them there, and the default stream made to wait for that gather.
void Decoder::Impl::use_weights(int64_t layer) {
  prefetch_weights(layer);
  KTUNE_CUDA_CHECK(cudaStreamWaitEvent(nullptr, slot_gathered[slot_of(layer)], 0));
}

// ---- The ZeRO-2 gradient slots (shard_gradients) ----
// Layer l's gradients are written into gradient slot l % 2; units 0 (the embedding) and L + 1 (the
// final norm, an untied lm_head) have buffers of their own, or with an untied head one between them
// (whole_units_shared): unit L + 1's reduce-scatter is enqueued after the loss and the final norm,
// and the backward settles it (waits for it, adds its piece) and zeroes the buffer for the embedding
// right before the embedding's backward, so the one channel serves both in turn. Two streams touch them: the DEFAULT
// stream (the slot zeroed, the layer's backward kernels that write it, then this rank's reduced
// piece added into its accumulator) and the reduce hook's stream (the in-place reduce-scatter,
// GradientReduce::enqueue). Who waits on whom, for the channel of a unit (the slot, or the unit's own
// buffer, channel_of):
//   - the reduce-scatter of unit u waits (on the hook's stream) for grad_ready[channel], recorded on
//     the default stream right behind u's last backward kernel (reduce_unit);
//   - the default stream waits for grad_reduced[channel] (recorded behind the reduce-scatter on the
//     hook's stream) before it adds the piece into the accumulator (settle), and it settles a slot
//     before it zeroes the slot for the layer two below: the slot is rewritten only once its
//     reduce-scatter is done and its piece read. So layer l's backward (slot l % 2) runs while layer
//     l + 1's reduce-scatter (the other slot) runs on the hook's stream; layer l - 1's waits for it.
//   - what is still pending when the backward ends (the last two layers' slots, unit L + 1's, unit
//     0's: the embedding's is the backward's last and nothing overlaps it) is settled then
//     (settle_all), before the poll and the step's host synchronisation.
// One stream for all the group's collectives (NCCL runs one communicator's collectives in the order
// they are issued anyway): with ZeRO-3 the backward issues, per layer l, the gather of layer l - 1
// (at the start of layer l) and the reduce-scatter of layer l (at its end), so the gather of layer
// l - 1 queues behind the reduce-scatter of layer l + 1. It costs nothing: layer l - 1's backward
// needs both before it starts (its weights, and its gradient slot, which is layer l + 1's), so each
// layer's backward hides one reduce-scatter and one gather, and the step is held up only where
// those two take longer than a layer's backward (communication-bound). The forward issues gathers
// only (the reduce-scatters are all settled by the end of the previous forward_backward).
// No host synchronisation: wait_for_collectives polls both hooks before each host sync of a step.

// The reduce channel of unit u: its layer's gradient slot (0, 1), or unit 0's or unit L + 1's buffer.
int Decoder::Impl::channel_of(int64_t unit) const {
  const int64_t L = int64_t(grad_units->size()) - 2;
  if (unit == 0) return kGradSlots;
  if (unit == L + 1) return whole_units_shared ? kGradSlots : kGradSlots + 1;
  return int((unit - 1) % kGradSlots);
}

// Unit u's gradients of this micro-batch are complete on the default stream: its reduce-scatter
// enqueued behind them; its piece is added into the accumulator later (settle).
void Decoder::Impl::reduce_unit(int64_t unit) {
  if (!reducing_units) return;
  const int k = channel_of(unit);
  check(reducing[k] < 0, "cuda decoder", "gradient unit " + std::to_string(unit) + "'s buffer still reducing");
  KTUNE_CUDA_CHECK(cudaEventRecord(grad_ready[k], nullptr));
  gradient_reduce->enqueue(unit, grad_ready[k], grad_reduced[k]);
  reducing[k] = unit;
}

// The channel's enqueued reduce-scatter waited for on the default stream, and this rank's summed
// piece added into its accumulator there; the buffer is free for the next unit then.
void Decoder::Impl::settle(int channel) {
  const int64_t unit = reducing[channel];
  if (unit < 0) return;
  const Decoder::GradientUnit& u = (*grad_units)[size_t(unit)];
  KTUNE_CUDA_CHECK(cudaStreamWaitEvent(nullptr, grad_reduced[channel], 0));
  accumulate_inplace(grad_accumulator + u.shard_offset, u.grads + grad_shard * u.piece, u.piece);
  reducing[channel] = -1;
}

// Every pending unit's piece in the accumulator (the end of a backward).
void Decoder::Impl::settle_all() {
  for (int k = 0; k < kReduceChannels; ++k) settle(k);
}

// Every gather and reduce-scatter enqueued so far has landed (or its collective's Error thrown):
// before a host sync.
void Decoder::Impl::wait_for_collectives() {
  if (sharded_weights() && weight_gather->wait_all) weight_gather->wait_all();
  if (grad_units && gradient_reduce->wait_all) gradient_reduce->wait_all();
}

std::vector<float> Decoder::download_value(const std::string& name) {
  DeviceParameter& p = parameter(name);
  synchronize();
  check(!weights_sharded(p) || impl_->slot_layer[impl_->slot_of(p.weight_layer)] == p.weight_layer,
        "cuda decoder: parameter " + name,
        "its layer's weights are sharded (shard_weights) and not gathered: gather_weights(" +
            std::to_string(p.weight_layer) + ") first, on every rank");
  if (p.nf4_codes) {
    std::vector<uint8_t> codes(size_t(p.numel / 2));
    std::vector<bf16_t> held(size_t(p.numel / cpu::kNf4BlockSize));
    std::vector<float> scales(held.size()), out(size_t(p.numel));
    copy_to_host(codes.data(), p.nf4_codes, codes.size());
    copy_to_host(held.data(), p.nf4_scales, held.size() * sizeof(bf16_t));
    for (size_t b = 0; b < held.size(); ++b) scales[b] = ktune::bf16_to_f32(held[b]);
    cpu::nf4_dequantize(out.data(), codes.data(), scales.data(), p.numel, cpu::Nf4Arithmetic::kBf16);
    return out;
  }
  std::vector<bf16_t> host(size_t(p.numel));
  copy_to_host(host.data(), p.value, host.size() * sizeof(bf16_t));
  std::vector<float> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = ktune::bf16_to_f32(host[i]);
  return out;
}

std::vector<float> Decoder::download_grad(const std::string& name) {
  DeviceParameter& p = parameter(name);
  check(p.grad != nullptr, "cuda decoder: parameter " + name, "is frozen: it has no gradient");
  check(!setup_.shard_gradients, "cuda decoder: parameter " + name,
        "its gradient is sharded (shard_gradients): this rank holds the reduced sums of its piece only");
  std::vector<float> out(size_t(p.numel));
  synchronize();
  copy_to_host(out.data(), p.grad, out.size() * sizeof(float));
  return out;
}

// The whole arena: the gradients, the gaps between them and the padding to whole shards.
float* Decoder::gradient_buffer(int64_t* count) {
  check(!setup_.shard_gradients, "cuda decoder",
        "with shard_gradients no buffer holds every gradient (gradient_units(), optimizer_shard().grad)");
  DeviceArena& grads = *impl_->grad_arena;
  *count = int64_t(grads.capacity() / sizeof(float));
  return static_cast<float*>(grads.data());
}

void Decoder::zero_grad() {
  DeviceArena& grads = *impl_->grad_arena;
  if (grads.capacity() > 0) KTUNE_CUDA_CHECK(cudaMemsetAsync(grads.data(), 0, grads.capacity(), nullptr));
}

void Decoder::adamw_step(const cpu::AdamWStep& st, uint64_t seed) {
  for (size_t i = 0; i < params_.size(); ++i) {
    DeviceParameter& p = params_[i];
    if (!p.m) continue;  // frozen, or none of it in this rank's shard
    const int64_t first = p.shard_begin;
    cuda::adamw_step_bf16(p.shard_value, p.shard_grad, p.m, p.v, p.shard_end - first, st,
                          splitmix64(seed ^ splitmix64(i + 1)), nullptr, first);
  }
  // ZeRO-3: a full fine-tune's pieces moved on, so the gathered layers are stale; LoRA's sharded base
  // is frozen (its pieces unchanged), so the slots still hold the layers they hold.
  if (setup_.full_finetune) impl_->forget_slots();
}

std::string Decoder::memory_report() const {
  std::ostringstream os;
  const MemoryPlan& m = plan_bytes_;
  os << "planned device memory: parameters " << gib(m.parameters) << ", gradients " << gib(m.gradients)
     << ", AdamW state " << gib(m.optimizer) << ", activations " << gib(m.activations)
     << " (of which the loss's scratch " << gib(m.loss_scratch) << ", chunks of " << impl_->ce_chunk << " tokens"
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

// ---------------------------------------------------------------------------------------------
// The step

namespace {

// Profiling events: 0/1 the step, 2/3 the loss, 4 + 6l + {0,1} layer l's attention forward, + {2,3} its
// backward, + {4,5} checkpointing's second forward of it.
size_t attn_event(int64_t l, int k) { return size_t(4 + 6 * l + k); }

}  // namespace

LinearRef Decoder::Impl::lin(const Linear& l) {
  LinearRef ref{P(l.weight).value, P(l.weight).grad};
  ref.in = l.in, ref.out = l.out, ref.r = lora_rank, ref.scale = lora_scale;
  ref.nf4_codes = P(l.weight).nf4_codes, ref.nf4_scales = P(l.weight).nf4_scales;
  if (dropping && l.lora_a >= 0) {
    ref.dropout = dropout_p;
    ref.dropout_seed = lora_dropout_seed(lora_seed, dropout_key, l.module);
  }
  if (l.bias >= 0) ref.bias = P(l.bias).value, ref.dbias = P(l.bias).grad;
  if (l.lora_a >= 0) {
    ref.a = P(l.lora_a).value, ref.da = P(l.lora_a).grad;
    ref.b = P(l.lora_b).value, ref.db = P(l.lora_b).grad;
  }
  if (l.magnitude >= 0) {
    ref.m = P(l.magnitude).value, ref.dm = P(l.magnitude).grad;
    ref.pre = l.dora_pre, ref.norm = l.dora_norm, ref.c = l.dora_scale;
  }
  return ref;
}

// W (out, in) bf16 for a GEMM: the weight itself, or (QLoRA) its NF4 codes dequantised into the
// scratch, which holds it until the next NF4 projection's call.
const bf16_t* Decoder::Impl::base_weight(const LinearRef& w) {
  if (!w.nf4_codes) return w.w;
  nf4_dequantize(nf4_weight, w.nf4_codes, w.nf4_scales, w.out * w.in);
  return nf4_weight;
}

// With TrainingSetup::nf4_fused_gemm, an NF4 base of shapes the fused kernel takes (DoRA's read the
// whole W for their norms and keep the scratch).
bool Decoder::Impl::fused_nf4(const LinearRef& w) const {
  return w.nf4_codes && nf4_gemm_fused(nf4_fused, w.m != nullptr, w.out, w.in);
}

// y (N, out) = beta * y + x W^T [+ b]: cuBLASLt on W (bf16, or NF4 dequantised into the scratch), or
// the GEMM that dequantises NF4 tile by tile.
void Decoder::Impl::base_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, float beta) {
  if (!fused_nf4(w)) return mm(false, true, N, w.out, w.in, 1.0f, x, base_weight(w), beta, y, DType::BF16, w.bias);
  Nf4GemmCall g;
  g.M = N, g.N = w.out, g.K = w.in, g.beta = beta, g.A = x, g.codes = w.nf4_codes, g.scales = w.nf4_scales;
  g.w_transposed = true, g.C = y, g.out = DType::BF16, g.bias = w.bias;
  nf4_gemm(g);
}

// dx (N, in) = beta * dx + dy W, as base_forward.
void Decoder::Impl::base_backward_input(bf16_t* dx, const bf16_t* dy, const LinearRef& w, float beta) {
  if (!fused_nf4(w)) return mm(false, false, N, w.in, w.out, 1.0f, dy, base_weight(w), beta, dx, DType::BF16);
  Nf4GemmCall g;
  g.M = N, g.N = w.in, g.K = w.out, g.beta = beta, g.A = dy, g.codes = w.nf4_codes, g.scales = w.nf4_scales;
  g.w_transposed = false, g.C = dx, g.out = DType::BF16;
  nf4_gemm(g);
}

// y (N, out) = beta * y + x W^T [+ b] [+ s (x' A^T) B^T];  xa = x' A^T (N, r) saved; x' = dropout(x)
// with LoRA dropout, else x
void Decoder::Impl::linear_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta) {
  if (w.m) return dora_forward(y, x, w, xa, beta);
  base_forward(y, x, w, beta);
  if (w.a) {
    const bf16_t* xd = x;
    if (w.dropout > 0) {
      lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
      xd = dropped_x;
    }
    mm(false, true, N, w.r, w.in, 1.0f, xd, w.a, 0.0f, xa, DType::BF16);
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, y, DType::BF16);
  }
}

// Undoes y = x W^T + b + s (x' A^T) B^T: dx (N, in) overwritten (or += when accumulate; nullptr: not
// wanted), dW += dy^T x (trainable base only), db += column sums of dy (as ones (1, N) @ dy),
// dB += s dy^T xa, dA += g^T x' with g = s dy B, dx += mask (g A) / (1 - p) (x' = x without dropout:
// dx += g A). The dropout mask is redrawn from the same seed as the forward's.
// Every read of x comes before the first write of dx, so dx may be x itself (the MLP's d act over
// act): the weight gradients first, then dx = dy W (+ its LoRA part), in the order that sums dx.
void Decoder::Impl::linear_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x,
                                    const LinearRef& w, const bf16_t* xa) {
  if (w.m) return dora_backward(dx, accumulate, dy, x, w, xa);
  if (w.dw) mm(true, false, w.out, w.in, N, 1.0f, dy, x, 1.0f, w.dw, DType::F32);
  if (w.dbias) mm(false, false, 1, w.out, N, 1.0f, ones, dy, 1.0f, w.dbias, DType::F32);
  if (w.a) {
    mm(true, false, w.out, w.r, N, w.scale, dy, xa, 1.0f, w.db, DType::F32);
    mm(false, false, N, w.r, w.out, w.scale, dy, w.b, 0.0f, lora_g, DType::BF16);
    if (w.dropout > 0)  // x' again
      lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
    mm(true, false, w.r, w.in, N, 1.0f, lora_g, w.dropout > 0 ? dropped_x : x, 1.0f, w.da, DType::F32);
  }
  if (!dx) return;  // x is read no more
  base_backward_input(dx, dy, w, accumulate ? 1.0f : 0.0f);
  if (!w.a) return;
  if (w.dropout > 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = g A
    lora_dropout_backward_add(dx, dropped_x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
  } else {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dx, DType::BF16);
  }
}

// DoRA (LoraAdapter's, PEFT's): norm (out) = ‖W + s B A‖ per row, c = m / norm. weight: W (out, in)
// bf16 (base_weight's).
void Decoder::Impl::dora_norms(const LinearRef& w, const bf16_t* weight) { dora_norm_rows(w, weight, 0, w.out); }

// The same for W's rows [o0, o0 + rows) (rows: their bf16 values, (rows, in)).
void Decoder::Impl::dora_norm_rows(const LinearRef& w, const bf16_t* rows, int64_t o0, int64_t n) {
  dora_widen(dora_w, rows, n * w.in);
  mm(false, false, n, w.in, w.r, w.scale, w.b + o0 * w.r, w.a, 1.0f, dora_w, DType::F32);  // += s B[rows] @ A
  dora_weight_norm(w.norm + o0, w.c + o0, dora_w, w.m + o0, n, w.in);
}

// y (N, out) = beta * y + c ⊙ pre + b, pre = x W^T + s xa B^T, xa = x A^T (no dropout);
// y = beta * y + x W^T + b + c ⊙ pre − x' W^T, pre = x' W^T + s xa B^T, xa = x' A^T (dropout).
// pre, norm, c saved for the backward.
void Decoder::Impl::dora_forward(bf16_t* y, const bf16_t* x, const LinearRef& w, bf16_t* xa, float beta) {
  const bf16_t* weight = base_weight(w);  // stays valid through this call (no other NF4 dequantisation)
  dora_norms(w, weight);
  const bf16_t* xd = x;
  if (w.dropout > 0) {
    lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
    xd = dropped_x;
  }
  mm(false, true, N, w.r, w.in, 1.0f, xd, w.a, 0.0f, xa, DType::BF16);
  if (w.dropout > 0) {
    mm(false, true, N, w.out, w.in, 1.0f, x, weight, beta, y, DType::BF16, w.bias);  // y = beta y + x W^T + b
    mm(false, true, N, w.out, w.in, 1.0f, xd, weight, 0.0f, dora_p1, DType::BF16);   // p1 = x' W^T
    KTUNE_CUDA_CHECK(
        cudaMemcpyAsync(w.pre, dora_p1, size_t(N * w.out) * 2, cudaMemcpyDeviceToDevice, nullptr));
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, w.pre, DType::BF16);  // pre = p1 + s xa B^T
    dora_combine(y, w.pre, dora_p1, w.c, nullptr, 1.0f, N, w.out);
  } else {
    mm(false, true, N, w.out, w.in, 1.0f, x, weight, 0.0f, w.pre, DType::BF16);  // pre = x W^T
    mm(false, true, N, w.out, w.r, w.scale, xa, w.b, 1.0f, w.pre, DType::BF16);  //     + s xa B^T
    dora_combine(y, w.pre, nullptr, w.c, w.bias, beta, N, w.out);
  }
}

// Undoes dora_forward (the norm detached, the base frozen): d = dy ⊙ c; dm += Σ_n dy ⊙ pre / norm;
// dB += s d^T xa; g = s d B; dA += g^T x'; dx (overwritten, or += when accumulate; nullptr: not
// wanted) = d W + g A (no dropout), or dy W + mask ⊙ (g A + ((c − 1) ⊙ dy) W) / (1 − p) (dropout).
// As linear_backward, every read of x before the first write of dx.
void Decoder::Impl::dora_backward(bf16_t* dx, bool accumulate, const bf16_t* dy, const bf16_t* x,
                                  const LinearRef& w, const bf16_t* xa) {
  const bf16_t* weight = dx ? base_weight(w) : nullptr;  // valid through this call
  dora_scale_columns(dora_d, dy, w.c, 0.0f, N, w.out);  // d = dy ⊙ c
  dora_magnitude_grad(w.dm, dy, w.pre, w.norm, N, w.out);
  mm(true, false, w.out, w.r, N, w.scale, dora_d, xa, 1.0f, w.db, DType::F32);      // dB += s d^T xa
  mm(false, false, N, w.r, w.out, w.scale, dora_d, w.b, 0.0f, lora_g, DType::BF16);  // g = s d B
  if (w.dropout > 0)  // x' again
    lora_dropout_forward(dropped_x, x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
  mm(true, false, w.r, w.in, N, 1.0f, lora_g, w.dropout > 0 ? dropped_x : x, 1.0f, w.da, DType::F32);
  if (!dx) return;  // x is read no more
  mm(false, false, N, w.in, w.out, 1.0f, w.dropout > 0 ? dy : dora_d, weight, accumulate ? 1.0f : 0.0f, dx,
     DType::BF16);
  if (w.dropout <= 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dx, DType::BF16);
    return;
  }
  mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = g A
  dora_scale_columns(dora_d, dy, w.c, -1.0f, N, w.out);                             //   + ((c − 1) ⊙ dy) W
  mm(false, false, N, w.in, w.out, 1.0f, dora_d, weight, 1.0f, dropped_x, DType::BF16);
  lora_dropout_backward_add(dx, dropped_x, N * w.in, w.dropout_seed, w.dropout, w.dropout_first);
}

void Decoder::Impl::set_step_shape(int64_t batch, int64_t seq_len) {
  check(seq_len >= 0 && seq_len <= T_max, "cuda decoder",
        "a step of seq_len " + std::to_string(seq_len) + " for a decoder planned for at most " + std::to_string(T_max));
  check(batch >= 0 && batch <= B_max, "cuda decoder",
        "a step of " + std::to_string(batch) + " rows for a decoder planned for at most " + std::to_string(B_max));
  T = seq_len > 0 ? seq_len : T_max;
  B = batch > 0 ? batch : B_max;
  N = B * T;
  for (Layer& layer : layers) layer.attention.B = B, layer.attention.T = T;
}

void Decoder::Impl::upload_batch(const DecoderConfig& c, const int32_t* tokens_host, const int32_t* labels_host,
                                 const int32_t* positions_host, const int32_t* doc_ids_host) {
  copy_to_device(tokens, tokens_host, size_t(N) * sizeof(int32_t));
  copy_to_device(labels, labels_host, size_t(N) * sizeof(int32_t));
  step_docs = nullptr;
  step_bounds = DocumentBounds{};
  step_host_bounds = HostDocumentBounds{};
  if (doc_ids_host) {
    copy_to_device(doc_ids, doc_ids_host, size_t(N) * sizeof(int32_t));
    step_docs = doc_ids;
    host_first_key.resize(size_t(N));
    host_last_query.resize(size_t(N));
    document_bounds(host_first_key.data(), host_last_query.data(), doc_ids_host, B, T);
    copy_to_device(doc_first_key, host_first_key.data(), size_t(N) * sizeof(int32_t));
    copy_to_device(doc_last_query, host_last_query.data(), size_t(N) * sizeof(int32_t));
    step_bounds = DocumentBounds{doc_first_key, doc_last_query};
    step_host_bounds = HostDocumentBounds{host_first_key.data(), host_last_query.data()};
  }
  if (positions_host) {
    // A sample split across packs continues its count past T: the table grows as the CPU one does
    // (to twice its rows at least); a negative position is the rope kernel's to flag.
    const int32_t highest = *std::max_element(positions_host, positions_host + N);
    if (highest >= rope_rows) build_rope_table(c, std::max<int64_t>(int64_t(highest) + 1, 2 * rope_rows));
    copy_to_device(positions, positions_host, size_t(N) * sizeof(int32_t));
    positions_T = positions_B = 0;  // no longer 0..T-1: the next step without positions lays them out again
    return;
  }
  if (positions_T == T && positions_B >= B) return;  // 0..T-1 in every row already
  std::vector<int32_t> pos(static_cast<size_t>(N));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) pos[size_t(b * T + t)] = int32_t(t);
  copy_to_device(positions, pos.data(), pos.size() * sizeof(int32_t));
  positions_T = T, positions_B = B;
}

void Decoder::Impl::forward(const DecoderConfig& c, bool for_backward) {
  const int64_t C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  // Offloading: input j (resid[j]) claims its slot before it is written and is sent to the host
  // (if a later input takes the slot) once it is.
  if (offloading) offload.claim(0);
  embedding_forward(resid[0], tokens, P(embed).value, N, C, V, embed_scale, flag.data());
  if (offloading) offload.stored(0, N * C, for_backward);
  for (int64_t l = 0; l < L; ++l) {
    // ZeRO-3: layer l's weights in their slot (gathered now only where no prefetch brought them), and
    // layer l + 1's gather enqueued into the other slot, to run while layer l computes.
    if (sharded_weights()) {
      use_weights(l);
      if (l + 1 < L && prefetching()) prefetch_weights(l + 1);
    }
    if (offloading) offload.claim(l + 1);
    layer_forward(c, l, resid[size_t(l)], resid[size_t(l) + 1]);
    if (offloading) offload.stored(l + 1, N * C, for_backward);
  }
  rmsnorm_forward(final_normed, final_rstd, resid[size_t(L)], P(final_norm).value, N, C, c.rms_norm_eps,
                  c.norm_weight_offset);
}

// Layer l from x_in to x_out, saving into acts[l]. With activation checkpointing the backward runs
// both halves again for layer l (attention_half with recompute = true, the MLP a chunk of rows at a
// time in mlp_rows_backward): the same kernels on the same input and parameters, the dropout masks
// from the same key, so acts[l] holds what the first forward saved there, bit for bit; the MLP's
// output rows then go to scratch (the backward no longer reads the next layer's input, whose offload
// slot may be taking another layer's input back by then).
void Decoder::Impl::layer_forward(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bf16_t* x_out) {
  attention_half(c, l, x_in, false);
  mlp_forward(c, l, x_out);
}

// x_in .. h (x_mid) = x + [post_attn_norm](o(attention(...))), then ln2 = norm2(h).
void Decoder::Impl::attention_half(const DecoderConfig& c, int64_t l, const bf16_t* x_in, bool recompute) {
  const int64_t C = c.hidden_size;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const RopeTableView rope{rope_cos.as<float>(), rope_sin.as<float>(), rope_rows, D};
  const float eps = c.rms_norm_eps, off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  rmsnorm_forward(a.ln1, a.rstd1, x_in, P(layer.norm_attn).value, N, C, eps, off);
  linear_forward(a.q, a.ln1, lin(layer.proj[kQ]), a.xa[kQ], 0.0f);
  linear_forward(a.k, a.ln1, lin(layer.proj[kK]), a.xa[kK], 0.0f);
  linear_forward(a.v, a.ln1, lin(layer.proj[kV]), a.xa[kV], 0.0f);
  rope_forward(a.q, positions, rope, N, Hq, D, flag.data());
  rope_forward(a.k, positions, rope, N, Hkv, D, flag.data());
  mark(attn_event(l, recompute ? 4 : 0));
  if (layer.kernel == TrainingSetup::Attention::kTensorCore)
    flash_attention_tc_forward(a.att, a.lse, a.q, a.k, a.v, layer.attention, nullptr, step_docs, step_bounds);
  else if (layer.kernel == TrainingSetup::Attention::kGemm)
    attention_gemm_forward(gemm, a.att, a.lse, a.q, a.k, a.v, layer.attention, attn_gemm_scratch, nullptr, step_docs,
                           step_host_bounds);
  else
    attention_forward(a.att, a.lse, a.q, a.k, a.v, step_docs, step_bounds, layer.attention);
  mark(attn_event(l, recompute ? 5 : 1));
  if (recompute) attention_recompute_ran[size_t(l)] = true;
  if (c.sandwich_norms) {  // h = x + post_attn_norm(o(att))
    linear_forward(a.o, a.att, lin(layer.proj[kO]), a.xa[kO], 0.0f);
    rmsnorm_forward(a.x_mid, a.rstd_o, a.o, P(layer.norm_attn_out).value, N, C, eps, off);
    add_inplace(a.x_mid, x_in, N * C);
  } else {  // h = x + o(att): x copied into h, the projection accumulated onto it (beta = 1)
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(a.x_mid, x_in, size_t(N * C) * 2, cudaMemcpyDeviceToDevice, nullptr));
    linear_forward(a.x_mid, a.att, lin(layer.proj[kO]), a.xa[kO], 1.0f);
  }
  rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, P(layer.norm_mlp).value, N, C, eps, off);
}

// y = h + [post_ff_norm](down(act(gate(ln2)) * up(ln2))), mlp_rows rows at a time.
void Decoder::Impl::mlp_forward(const DecoderConfig& c, int64_t l, bf16_t* x_out) {
  const int64_t chunk = mlp_chunked ? mlp_rows : N;
  for (int64_t first = 0; first < N; first += chunk) mlp_rows_forward(c, l, first, std::min(chunk, N - first), x_out);
}

void Decoder::Impl::mlp_rows_forward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows, bf16_t* x_out) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, r = lora_rank;
  const float eps = c.rms_norm_eps, off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  const RowScope scope(*this, rows);
  const bf16_t* ln2 = a.ln2 + first * C;  // (rows, C)
  bf16_t* y = x_out + first * C;          // (rows, C)
  const bf16_t* h = a.x_mid + first * C;  // (rows, C)
  linear_forward(a.gate, ln2, rows_from(lin(layer.proj[kGate]), first), offset(a.xa[kGate], first * r), 0.0f);
  linear_forward(a.up, ln2, rows_from(lin(layer.proj[kUp]), first), offset(a.xa[kUp], first * r), 0.0f);
  if (c.activation == DecoderConfig::Activation::kSiLU) swiglu_forward(a.act, a.gate, a.up, rows * I);
  else geglu_tanh_forward(a.act, a.gate, a.up, rows * I);
  const LinearRef down = rows_from(lin(layer.proj[kDown]), first);
  if (c.sandwich_norms) {  // y = h + post_ff_norm(mlp)
    bf16_t* d = a.down + first * C;
    linear_forward(d, a.act, down, offset(a.xa[kDown], first * r), 0.0f);
    rmsnorm_forward(y, a.rstd_down + first, d, P(layer.norm_mlp_out).value, rows, C, eps, off);
    add_inplace(y, h, rows * C);
  } else {
    KTUNE_CUDA_CHECK(cudaMemcpyAsync(y, h, size_t(rows * C) * 2, cudaMemcpyDeviceToDevice, nullptr));
    linear_forward(y, a.act, down, offset(a.xa[kDown], first * r), 1.0f);  // y = h + mlp
  }
}

// d act over act, then d gate and d up over gate and up: nothing reads them after this in the step
// (the next forward, or checkpointing's recompute, writes them again), and linear_backward reads
// its x before it writes dx: 3 (rows, I) bf16 buffers fewer.
void Decoder::Impl::mlp_rows_backward(const DecoderConfig& c, int64_t l, int64_t first, int64_t rows) {
  const int64_t C = c.hidden_size, I = c.intermediate_size, r = lora_rank;
  const float off = c.norm_weight_offset;
  const Layer& layer = layers[size_t(l)];
  const Acts& a = acts[size_t(l)];
  // Chunked: these rows' gate, up, act (and LoRA's x A^T, DoRA's pre-activations, the post-ff norm's
  // input) again; their output goes into dln's rows, which this chunk's backward writes last.
  if (mlp_chunked) mlp_rows_forward(c, l, first, rows, dln);
  const RowScope scope(*this, rows);
  const bf16_t* dy = dres + first * C;  // (rows, C)
  bf16_t* dln_rows = dln + first * C;
  const bf16_t* ln2 = a.ln2 + first * C;
  if (c.sandwich_norms) {  // dtmp's rows = d down, read by down's backward before anything rewrites them
    bf16_t* d_down = dtmp + first * C;
    rmsnorm_backward(d_down, P(layer.norm_mlp_out).grad, dy, a.down + first * C, P(layer.norm_mlp_out).value,
                     a.rstd_down + first, rows, C, off);
    dy = d_down;
  }
  bf16_t* dact = a.act;
  linear_backward(dact, false, dy, a.act, rows_from(lin(layer.proj[kDown]), first), offset(a.xa[kDown], first * r));
  bf16_t* dgate = a.gate;
  bf16_t* dup = a.up;
  if (c.activation == DecoderConfig::Activation::kSiLU)
    swiglu_backward(dgate, dup, dact, a.gate, a.up, rows * I);
  else
    geglu_tanh_backward(dgate, dup, dact, a.gate, a.up, rows * I);
  linear_backward(dln_rows, false, dgate, ln2, rows_from(lin(layer.proj[kGate]), first),
                  offset(a.xa[kGate], first * r));
  linear_backward(dln_rows, true, dup, ln2, rows_from(lin(layer.proj[kUp]), first), offset(a.xa[kUp], first * r));
}

// The output projection fused with cross-entropy over final_normed. backward: dnormed (N, C) f32
// overwritten with grad_scale * d(sum)/d(final_normed) and the head's gradients accumulated (W's when
// it trains; A's and B's with LoRA on lm_head); otherwise neither is touched. LoRA on lm_head follows
// LoraAdapter::fused_output_cross_entropy: xa = x' A^T once for all N rows, the low-rank term inside
// each chunk (linear_cross_entropy's LoraHead), then through xa after the loss.
void Decoder::Impl::loss(const DecoderConfig& c, float grad_scale, bool backward) {
  const DeviceParameter& h = P(head);
  mark(2);
  const bool adapted = output.lora_a >= 0;
  const LinearRef w = adapted ? lin(output) : LinearRef{h.value, h.grad};
  if (w.m) head_dora_norms(w);  // before x' (head_lora_forward): both use the projections' scratch
  LoraHead lora = adapted ? head_lora_forward(w, backward) : LoraHead{};
  if (w.nf4_codes) {  // QLoRA on lm_head: W dequantised a block of rows at a time inside the loss
    lora.nf4_codes = w.nf4_codes, lora.nf4_scales = w.nf4_scales;
    lora.nf4_block_rows = head_rows, lora.nf4_block = head_weight;
  }
  linear_cross_entropy_enqueue(gemm, backward ? dnormed : nullptr, backward ? h.grad : nullptr, final_normed,
                               w.nf4_codes ? nullptr : h.value, lora, labels, N, c.hidden_size, c.vocab_size,
                               c.final_logit_softcap, grad_scale, ce_chunk, ce_scratch, loss_totals_at.data());
  if (backward && adapted) head_lora_backward(w);
  mark(3);
}

// The loss's sum and count, which the pass left on the device (loss_totals_at): read once
// the step has been enqueued whole, so the host never waits between the forward and the backward.
StepResult Decoder::Impl::loss_totals(const DecoderConfig& c) {
  const CrossEntropyTotals totals = linear_cross_entropy_totals(loss_totals_at.data(), c.vocab_size);  // synchronises
  StepResult result;
  result.loss_sum = totals.loss_sum;
  result.n_valid = totals.n_valid;
  return result;
}

// xa (N, r) = x' A^T, x' = dropout(final_normed) with LoRA dropout (module "lm_head", element n C + i
// of the (N, C) rows, the CPU adapter's masks), else final_normed. DoRA: c and the norms; with
// dropout x' stays through the loss (head_dropped), for PEFT's base terms h W^T − x' W^T + c ⊙ x' W^T.
LoraHead Decoder::Impl::head_lora_forward(const LinearRef& w, bool backward) {
  const bf16_t* x = final_normed;
  const bool dora_dropout = w.m && w.dropout > 0;
  if (w.dropout > 0) {
    bf16_t* xd = dora_dropout ? head_dropped : dropped_x;
    lora_dropout_forward(xd, final_normed, N * w.in, w.dropout_seed, w.dropout);
    x = xd;
  }
  mm(false, true, N, w.r, w.in, 1.0f, x, w.a, 0.0f, head_xa, DType::BF16);
  LoraHead lora;
  lora.rank = w.r, lora.scale = w.scale, lora.b = w.b, lora.xa = head_xa;
  if (backward) lora.dxa = lora_g, lora.db = w.db;  // dxa (N, r) in lora_g, until the layers' backward
  if (w.m) {
    lora.dora_scale = w.c, lora.weight_norm = w.norm;
    if (backward) lora.dmagnitude = w.dm;
  }
  if (dora_dropout) {
    lora.dropped_hidden = head_dropped;
    if (backward) lora.ddropped_hidden = head_ddropped;
  }
  return lora;
}

// DoRA on lm_head (the CPU adapter's compute_dora_scale): ‖W + s B A‖ per vocabulary row and
// c = m / that into w.norm, w.c (V), head_rows rows at a time (an NF4 W's rows dequantised first).
void Decoder::Impl::head_dora_norms(const LinearRef& w) {
  for (int64_t v0 = 0; v0 < w.out; v0 += head_rows) {
    const int64_t n = std::min(head_rows, w.out - v0);
    const bf16_t* rows = nf4_weight;
    if (w.nf4_codes)
      nf4_dequantize(nf4_weight, w.nf4_codes + v0 * w.in / 2, w.nf4_scales + v0 * w.in / cpu::kNf4BlockSize,
                     n * w.in);
    else
      rows = w.w + v0 * w.in;
    dora_norm_rows(w, rows, v0, n);
  }
}

// Undoes xa = x' A^T from the loss's dxa (lora_g): dA += dxa^T x'; dnormed += mask ⊙ (dxa A) / (1 - p)
// (without dropout x' = final_normed and dnormed += dxa A, in f32).
void Decoder::Impl::head_lora_backward(const LinearRef& w) {
  const bf16_t* x = final_normed;
  if (w.m && w.dropout > 0) {  // DoRA: x' kept; dnormed += mask ⊙ (the loss's ((c − 1) ⊙ dz) W + dxa A) / (1 - p)
    mm(true, false, w.r, w.in, N, 1.0f, lora_g, head_dropped, 1.0f, w.da, DType::F32);
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, head_ddropped, DType::F32);
    lora_dropout_backward_add(dnormed, head_ddropped, N * w.in, w.dropout_seed, w.dropout);
    return;
  }
  if (w.dropout > 0) {  // x' again
    lora_dropout_forward(dropped_x, final_normed, N * w.in, w.dropout_seed, w.dropout);
    x = dropped_x;
  }
  mm(true, false, w.r, w.in, N, 1.0f, lora_g, x, 1.0f, w.da, DType::F32);
  if (w.dropout <= 0) {
    mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 1.0f, dnormed, DType::F32);
    return;
  }
  mm(false, false, N, w.in, w.r, 1.0f, lora_g, w.a, 0.0f, dropped_x, DType::BF16);  // d x' = dxa A
  lora_dropout_backward_add(dnormed, dropped_x, N * w.in, w.dropout_seed, w.dropout);
}

void Decoder::Impl::backward(const DecoderConfig& c) {
  const int64_t C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  const int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim;
  const RopeTableView rope{rope_cos.as<float>(), rope_sin.as<float>(), rope_rows, D};
  const float off = c.norm_weight_offset;
  const bool sandwich = c.sandwich_norms;
  attention_backward_ran.assign(size_t(L), false);
  attention_recompute_ran.assign(size_t(L), false);

  // Which layers need their input gradient: anything trainable below them (or the embedding).
  std::vector<bool> trainable_in_layer(size_t(L), false);
  for (int64_t l = 0; l < L; ++l) {
    const Layer& layer = layers[size_t(l)];
    bool any = false;
    for (int norm : {layer.norm_attn, layer.norm_mlp, layer.norm_attn_out, layer.norm_mlp_out})
      any = any || (norm >= 0 && P(norm).grad);
    for (const auto& pr : layer.proj)
      any = any || P(pr.weight).grad || (pr.bias >= 0 && P(pr.bias).grad) || pr.lora_a >= 0;
    trainable_in_layer[size_t(l)] = any;
  }
  // below[l]: the embedding or a layer < l is trainable.
  std::vector<bool> below(size_t(L) + 1, false);
  below[0] = P(embed).grad != nullptr;
  for (int64_t l = 0; l < L; ++l) below[size_t(l) + 1] = below[size_t(l)] || trainable_in_layer[size_t(l)];

  const DeviceParameter& fnorm = P(final_norm);
  if (!below[size_t(L)] && !fnorm.grad) return;
  convert_to_bf16(dtmp, dnormed, N * C);
  if (offloading) offload.acquire(L);  // the final norm's input never left its slot
  rmsnorm_backward(dres, fnorm.grad, dtmp, resid[size_t(L)], fnorm.value, final_rstd, N, C, off);
  reduce_unit(L + 1);  // the final norm's and an untied head's gradients are complete
  for (int64_t l = L - 1; l >= 0; --l) {
    if (!below[size_t(l) + 1]) break;  // nothing trainable in this layer or below
    // ZeRO-3: layer l's weights in their slot for checkpointing's recompute and the backward both (the
    // forward's last two layers are still there), and layer l - 1's gather enqueued into the other
    // slot, to run while layer l computes, if the loop goes on to layer l - 1.
    if (sharded_weights()) {
      use_weights(l);
      if (l > 0 && below[size_t(l)] && prefetching()) prefetch_weights(l - 1);
    }
    // Offloading: input l back in its slot (its trip began a layer ago), and input l - 1's trip
    // begun now, behind this layer's work, if the loop goes on to layer l - 1.
    if (offloading) offload.acquire(l);
    if (offloading && l > 0 && below[size_t(l)]) offload.prefetch(l - 1, N * C);
    // Checkpointing: the layer's attention half again, from its saved input (the MLP runs again
    // chunk by chunk in mlp_rows_backward). The last layer's is still there from the forward (the
    // loss and the final norm's backward use scratch of their own).
    if (checkpointing && l < L - 1) attention_half(c, l, resid[size_t(l)], true);
    // ZeRO-2: layer l's gradient slot (layer l + 2's until now) free once layer l + 2's reduce-scatter
    // is done and its piece added into the accumulator, then zeroed for layer l's gradients (as late
    // as this: the recompute above writes no gradient, and runs while that reduce-scatter does).
    if (reducing_units) {
      const int k = int(l % kGradSlots);
      settle(k);
      KTUNE_CUDA_CHECK(cudaMemsetAsync(grad_slot[k], 0, grad_slot_bytes, nullptr));
    }
    const Layer& layer = layers[size_t(l)];
    const Acts& a = acts[size_t(l)];
    const bf16_t* x_in = resid[size_t(l)];
    // Undo y = h + [post_ff_norm](down(act(gate(n)) * up(n))), n = norm2(h): dln = d n, then d h.
    const int64_t chunk = mlp_chunked ? mlp_rows : N;
    for (int64_t first = 0; first < N; first += chunk) mlp_rows_backward(c, l, first, std::min(chunk, N - first));
    rmsnorm_backward(dtmp, P(layer.norm_mlp).grad, dln, a.x_mid, P(layer.norm_mlp).value, a.rstd2, N, C, off);
    add_inplace(dres, dtmp, N * C);  // dres = d h
    // Undo h = x + [post_attn_norm](o(attention(rope(q(n)), rope(k(n)), v(n)))), n = norm1(x)
    const bf16_t* dy_o = dres;
    if (sandwich) {  // dtmp = d o, read by o's backward before norm1's backward rewrites dtmp
      rmsnorm_backward(dtmp, P(layer.norm_attn_out).grad, dres, a.o, P(layer.norm_attn_out).value, a.rstd_o, N, C,
                       off);
      dy_o = dtmp;
    }
    linear_backward(datt, false, dy_o, a.att, lin(layer.proj[kO]), a.xa[kO]);
    mark(attn_event(l, 2));
    if (layer.kernel == TrainingSetup::Attention::kTensorCore)
      flash_attention_tc_backward(dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, layer.attention, attn_tc_scratch,
                                  nullptr, step_docs, step_bounds);
    else if (layer.kernel == TrainingSetup::Attention::kGemm)
      attention_gemm_backward(gemm, dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, layer.attention,
                              attn_gemm_scratch, nullptr, step_docs, step_host_bounds);
    else
      attention_backward(dq, dk, dv, datt, a.q, a.k, a.v, a.att, a.lse, step_docs, step_bounds, layer.attention,
                         attn_scratch);
    mark(attn_event(l, 3));
    attention_backward_ran[size_t(l)] = true;
    rope_backward(dq, positions, rope, N, Hq, D, flag.data());
    rope_backward(dk, positions, rope, N, Hkv, D, flag.data());
    const bool need_dx = below[size_t(l)] || P(layer.norm_attn).grad;
    bf16_t* dx = need_dx ? dln : nullptr;
    linear_backward(dx, false, dq, a.ln1, lin(layer.proj[kQ]), a.xa[kQ]);
    linear_backward(dx, true, dk, a.ln1, lin(layer.proj[kK]), a.xa[kK]);
    linear_backward(dx, true, dv, a.ln1, lin(layer.proj[kV]), a.xa[kV]);
    if (need_dx) {
      rmsnorm_backward(dtmp, P(layer.norm_attn).grad, dln, x_in, P(layer.norm_attn).value, a.rstd1, N, C, off);
      add_inplace(dres, dtmp, N * C);  // dres = d x
    }
    reduce_unit(1 + l);  // layer l's gradients are complete: its slot's reduce-scatter enqueued
  }
  const DeviceParameter& e = P(embed);
  if (reducing_units && whole_units_shared) {  // unit L + 1's piece added, its buffer zeroed for unit 0
    settle(channel_of(0));
    const Decoder::GradientUnit& unit = (*grad_units)[0];
    KTUNE_CUDA_CHECK(cudaMemsetAsync(unit.grads, 0, size_t(unit.size) * 4, nullptr));
  }
  if (e.grad) embedding_backward(e.grad, dres, tokens, N, C, V, embed_scale, flag.data());
  reduce_unit(0);  // the last: its piece is added by settle_all once the backward returns
}

// The end of a pass: the index flag's check (synchronises) and, when profiling, the times.
void Decoder::Impl::finish_step(const DecoderConfig& c, bool with_backward, Decoder::StepProfile* profile) {
  mark(1);
  flag.check("cuda decoder: token id or rotary position");  // synchronises
  if (!profiling) return;
  KTUNE_CUDA_CHECK(cudaEventSynchronize(events[1]));
  *profile = StepProfile{};
  profile->step_ms = between(0, 1);
  profile->loss_ms = between(2, 3);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    profile->attention_ms += between(attn_event(l, 0), attn_event(l, 1));
    if (with_backward && attention_backward_ran[size_t(l)])
      profile->attention_ms += between(attn_event(l, 2), attn_event(l, 3));
    if (with_backward && attention_recompute_ran[size_t(l)])
      profile->attention_ms += between(attn_event(l, 4), attn_event(l, 5));
  }
}

StepResult Decoder::forward_backward(const int32_t* tokens_host, const int32_t* labels_host, float grad_scale,
                                     int64_t seq_len, const int32_t* positions, const int32_t* doc_ids, int64_t batch) {
  Impl& s = *impl_;
  s.set_step_shape(batch, seq_len);
  s.upload_batch(config_, tokens_host, labels_host, positions, doc_ids);
  s.dropping = setup_.lora_dropout > 0;
  const int64_t gemm_calls_before = s.gemm.calls();
  s.mark(0);
  s.forward(config_, true);
  // shard_gradients: the whole units hold this micro-batch's gradients only (the accumulators sum
  // the micro-batches), so they start at zero; each layer zeroes its slot before its backward.
  s.reducing_units = false;
  s.forget_reduces();  // nothing pending (settled at the end of each pass, or a throw's leftovers)
  if (setup_.shard_gradients) {
    check(bool(gradient_reduce_.enqueue) && bool(gradient_reduce_.wait_all), "cuda decoder",
          "shard_gradients: no gradient reduce set (set_gradient_reduce) to reduce the gradients");
    for (int64_t u : {config_.num_layers + 1, int64_t(0)}) {
      if (u == 0 && s.whole_units_shared) continue;  // zeroed by the backward once unit L + 1 is reduced
      KTUNE_CUDA_CHECK(cudaMemsetAsync(units_[size_t(u)].grads, 0, size_t(units_[size_t(u)].size) * 4, nullptr));
    }
    s.reducing_units = true;
  }
  s.loss(config_, grad_scale, true);  // enqueued: its sum stays on the device until the step's end
  const auto backward_start = std::chrono::steady_clock::now();
  s.backward(config_);
  s.settle_all();            // the pieces still pending (the last layers', units L + 1's and 0's)
  const double backward_host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - backward_start).count();
  s.reducing_units = false;
  s.wait_for_collectives();  // before finish_step's host synchronisation
  s.finish_step(config_, true, &profile_);
  const StepResult result = s.loss_totals(config_);
  if (s.profiling) {
    profile_.gemm_calls = s.gemm.calls() - gemm_calls_before;
    profile_.backward_host_ms = backward_host_ms;
    profile_.backward_device_ms = s.between(3, 1);
  }
  return result;
}

StepResult Decoder::forward_loss(const int32_t* tokens_host, const int32_t* labels_host, int64_t seq_len,
                                 const int32_t* positions, const int32_t* doc_ids, int64_t batch) {
  Impl& s = *impl_;
  s.set_step_shape(batch, seq_len);
  s.upload_batch(config_, tokens_host, labels_host, positions, doc_ids);
  s.dropping = false;  // evaluation: no dropout
  s.mark(0);
  s.forward(config_, false);
  s.loss(config_, 0.0f, false);
  s.wait_for_collectives();  // the forward's gathers, before finish_step's host synchronisation
  s.finish_step(config_, false, &profile_);
  return s.loss_totals(config_);
}

void Decoder::set_dropout_key(uint64_t key) { impl_->dropout_key = key; }

}  // namespace ktune::cuda
