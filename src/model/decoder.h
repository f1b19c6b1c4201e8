// Decoder: the Llama-family causal language model (llama, qwen2, mistral, gemma2) with an explicit
// forward and backward per layer, llm.c style. The forward saves what the backward needs in one
// planned activation arena (sized for the largest batch seen, printed when planned, never grown
// inside a step); with activation checkpointing only each layer's input is kept and the backward
// recomputes one layer's forward at a time. Gradients flow for any subset of parameters: a frozen
// projection costs no weight-gradient GEMM, yet activation gradients still reach the trainable ones
// below it. Tied embeddings get the sum of both uses. The loss uses the output projection fused with
// cross-entropy in chunks (kernels/cpu/cross_entropy.h): training never materialises the logits;
// an untied head is also a Linear ("lm_head", listed last by linears()), so LoRA/DoRA/QLoRA attach
// to it and run inside that fused loss (LoraAdapter::fused_output_cross_entropy).
//
// Layer (pre-norm):  h = x + [post_attn_norm](attn(rope(q), rope(k), v))   with q,k,v = proj(norm1(x))
//                    y = h + [post_ff_norm](down(act(gate(n)) * up(n)))      with n = norm2(h)
// (bracketed norms: Gemma2 only).
//
// Generation runs a token at a time against a key/value cache (forward_cached, model/kv_cache.h).
// It deliberately does not do dropout, bf16 activations (bf16 GEMMs round theirs per call), or the
// optimizer (the trainer runs AdamW over parameters()); adapters attach to Linear (model/linear.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/tensor.h"
#include "kernels/cpu/rope.h"
#include "model/config.h"
#include "model/linear.h"

namespace ktune::io {
class SafetensorsFile;
}

namespace ktune::model {

class KvCache;

// One sequence's part of a cached pass (Decoder::forward_cached): `count` new tokens whose keys and
// values join `cache`.
struct CachedSequence {
  KvCache* cache = nullptr;
  int64_t count = 0;
};

// One batch of B rows of T tokens, all int32, row-major (B, T).
struct Batch {
  const int32_t* tokens = nullptr;
  const int32_t* labels = nullptr;     // target of each position, -100 = ignored (forward_logits: unused)
  const int32_t* positions = nullptr;  // rotary positions; nullptr = 0..T-1 in every row
  const int32_t* doc_ids = nullptr;    // packed samples: attention stays within equal ids; nullptr = none
  int64_t B = 0, T = 0;
};

struct LossResult {
  double loss_sum = 0;  // sum of token cross-entropies over valid labels
  int64_t n_valid = 0;  // their count
};

// Called around each layer's compute with the layer index, so that sharded data parallelism
// (train/sharded_data_parallel.h) can gather a layer's parameters just before they are read and
// release them, and reduce its gradients, right after. The backward hooks run only for the layers
// the backward reaches (it stops below the lowest trainable one). Unset hooks are skipped.
struct LayerHooks {
  std::function<void(int64_t layer)> before_forward, after_forward, before_backward, after_backward;
};

struct LoadOptions {
  // How the weights are kept: F32, or BF16 (half the memory; multiplied as bf16 with the activations
  // rounded to bf16 per GEMM where cpu::bf16_weights_use_bf16_gemm(), else widened to f32 one weight at
  // a time; f32 accumulation either way. Their gradients are bf16 too, summed in f32 and rounded into
  // them once per micro-batch, or per block of rows (the head's: per chunk); pair with train::AdamW's
  // bf16 path). Checkpoints of any float dtype load.
  DType storage = DType::F32;
  // Values as read-only views of the mapped checkpoint files, in the files' dtypes (f32, bf16 or f16;
  // no copy: the pages are the page cache's, shared with every process that maps the file, a node's
  // other ranks among them, and read in as touched). A value mapped in
  // another dtype than `storage` keeps it as Parameter::stored_dtype and is read rounded to it
  // (stored_value, read_stored_f32), as a copy would hold it; the decoder then refuses to compute.
  // Only for a model whose values are read, then released, never written (a write into a mapped
  // value faults): a GPU run's ranks, which upload the values and release them (rank 0 keeping
  // what its saves read). Logs the bytes mapped.
  bool map_values = false;
};

class Decoder {
 public:
  // Parameters initialised for training from scratch (benchmarks): normal-ish(0, 0.02) with a
  // fixed seed, norms at their identity (1, or 0 for Gemma's 1+w).
  explicit Decoder(ModelConfig config, uint64_t seed = 0, DType storage = DType::F32);
  // config.json + model.safetensors (or the sharded index) from an HF model directory.
  // Throws an Error naming the file and the tensor for a missing tensor or a wrong shape.
  static std::unique_ptr<Decoder> from_pretrained(const std::string& dir, const LoadOptions& options = {});

  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  const ModelConfig& config() const { return config_; }
  DType storage() const { return storage_; }
  // What the embeddings are multiplied by: Gemma's sqrt(hidden_size), rounded to bf16 when the
  // weights are stored in bf16 (HF: the normalizer in the hidden states' dtype); 1 otherwise.
  float embed_scale() const { return embed_scale_; }

  // ---- parameters, by HF name, in HF's order (embed, layers, norm, lm_head) ----
  // Includes the parameters of attached adapters (after the base ones).
  std::vector<Parameter*> parameters();
  Parameter& parameter(const std::string& name);  // throws when absent
  // Marks each parameter trainable or frozen by name; allocates gradients (zeroed, in the value's
  // dtype) for the trainable ones and frees the others'. All parameters start trainable.
  void set_trainable(const std::function<bool(const std::string& name)>& trainable);
  // Whether trainable parameters get host gradients (on by default). Off for a model whose steps run
  // elsewhere (the GPU step holds the weights' gradients): every gradient is freed now, none is
  // allocated later (set_trainable, attaching adapters), and a backward throws.
  void set_host_gradients(bool on);
  // Frees the values of the parameters `release` selects (their tensors become empty), for a model
  // whose steps run elsewhere once the values went there. A decoder with a released value refuses to
  // compute (an Error naming the parameter); its parameters keep their names and trainable flags.
  void release_values(const std::function<bool(const Parameter& p)>& release);
  // LoadOptions::map_values: the bytes of the values held that are views of the checkpoint files'
  // mappings (released values and values replaced since the load not counted).
  int64_t mapped_value_bytes() const;
  bool value_is_mapped(const Parameter& p) const;
  // Drops the mapped values' pages from this process's resident memory (they stay in the page cache,
  // and a later read faults them in again from the file, unchanged): for a model that keeps mapped
  // values it reads rarely (a GPU run's rank 0 keeps the frozen base its saves merge into). Returns
  // the bytes of the values whose pages were dropped.
  int64_t drop_mapped_pages();
  void zero_grad();
  // The projections, for attaching adapters: names as HF modules ("model.layers.3.self_attn.v_proj"),
  // then the untied output head ("lm_head"; absent when tied).
  std::vector<Linear*> linears();
  Linear& linear(const std::string& module_name);
  // Call after attaching or detaching adapters (re-plans the arena on the next call).
  void adapters_changed();

  // ---- compute ----
  void set_layer_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return checkpointing_; }
  // Forward and backward. Gradients ACCUMULATE (+=) into the trainable parameters' grads, scaled by
  // grad_scale (pass 1/n_valid of the whole global batch for a token-mean loss); zero_grad() between
  // optimizer steps. Returns the unscaled loss sum and the count of valid labels.
  LossResult forward_backward(const Batch& batch, float grad_scale);
  // The loss without gradients (evaluation).
  LossResult forward_loss(const Batch& batch);
  // All logits (B, T, V) after the final soft-cap (parity tests): materialises them.
  Tensor forward_logits(const Batch& batch);
  // Generation: runs new tokens of S sequences through the model together, tokens (Σ count) laid
  // sequence after sequence. Each sequence's tokens sit at positions cache.length() onwards and
  // attend to the keys and values its own cache holds of the tokens before them; theirs join that
  // cache. Writes the logits (S, V, after the final soft-cap) of each sequence's last new token.
  // A prompt is one sequence's call; a decoding step of several answers is one call with a token
  // each, so that each projection is one GEMM for all of them. A new sequence starts from an empty
  // cache; the caches must be distinct.
  void forward_cached(const int32_t* tokens, const std::vector<CachedSequence>& sequences, float* last_logits);
  // One sequence: n tokens into `cache`, the logits (V) of the last.
  void forward_cached(const int32_t* tokens, int64_t n, KvCache& cache, float* last_logits);

  // Bytes of the activation arena for a batch of B x T tokens under the current settings.
  size_t planned_activation_bytes(int64_t B, int64_t T) const;
  size_t activation_arena_capacity() const { return arena_ ? arena_->capacity() : 0; }

 private:
  // Weights allocated in `storage` but not initialised: from_pretrained fills every one.
  struct WeightsToLoad {};
  Decoder(ModelConfig config, DType storage, WeightsToLoad);
  struct Layer;
  struct LayerActs;
  struct Plan;
  struct Take;

  void build_parameters();
  void allocate_grads();
  void init_random(uint64_t seed);
  void layout(Take& take, int64_t B, int64_t T, Plan& plan) const;
  Plan& prepare(const Batch& batch);
  void embed_forward(const Batch& batch, Plan& p, float* x);
  void embed_backward_bf16(const Batch& batch, Plan& p);
  void layer_forward(size_t l, const LayerActs& a, const float* x_in, float* x_out, const Plan& p);
  void layer_backward(size_t l, const LayerActs& a, const float* x_in, float* dres, const Plan& p);
  LossResult run(const Batch& batch, bool backward, float grad_scale, float* logits);
  // Throws unless every value is here, in the storage dtype (released or mapped in another: no compute).
  void check_computable() const;
  // logits (rows, V) = head(normed (rows, C)), soft-capped; the rows are at most the plan's N.
  void head_logits(float* logits, const float* normed, int64_t rows, const Plan& p);

  ModelConfig config_;
  DType storage_ = DType::F32;
  std::unique_ptr<cpu::RopeTable> rope_;
  std::vector<std::unique_ptr<Parameter>> params_;  // base parameters in HF order
  Parameter* embed_ = nullptr;
  Parameter* final_norm_ = nullptr;
  Parameter* lm_head_ = nullptr;  // null when tied
  Linear output_;                 // lm_head as a projection (weight null when tied): adapters attach here
  std::vector<std::unique_ptr<Layer>> layers_;
  float embed_scale_ = 1.0f;
  bool checkpointing_ = false;
  bool host_gradients_ = true;  // set_host_gradients
  std::string released_;        // release_values: the first parameter released ("" while none)
  // LoadOptions::map_values: the parameters whose values are views of a checkpoint file's mapping, and
  // that file (shared by its parameters; it keeps the file mapped while one of them is listed).
  std::map<std::string, std::shared_ptr<const io::SafetensorsFile>> mapped_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Plan> plan_;
  // Per call: the batch's document ids, and for each layer l whether anything below it (layers < l,
  // the embedding) is trainable; needs_grad_below_[L] covers the whole stack.
  const int32_t* doc_ids_ = nullptr;
  // forward_cached: the sequences whose caches the attention reads and extends (null otherwise).
  const std::vector<CachedSequence>* cached_sequences_ = nullptr;
  std::vector<bool> needs_grad_below_;
  LayerHooks hooks_;
};

}  // namespace ktune::model
