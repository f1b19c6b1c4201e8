// The decoder's parameters, activation plan, and per-layer forward/backward. See decoder.h.
#include "model/decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/trace_spans.h"
#include "core/random_bits.h"
#include "io/safetensors.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/bf16_rounding.h"
#include "kernels/cpu/cached_attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/rmsnorm.h"
#include "model/adapters/lora_adapter.h"
#include "model/kv_cache.h"

namespace ktune::model {

namespace fs = std::filesystem;

// The parameters and projections of one layer.
struct Decoder::Layer {
  Linear q, k, v, o, gate, up, down;
  Parameter* norm_attn_in = nullptr;   // input_layernorm
  Parameter* norm_attn_out = nullptr;  // Gemma2 post_attention_layernorm (on the attention output)
  Parameter* norm_mlp_in = nullptr;    // post_attention_layernorm (Gemma2: pre_feedforward_layernorm)
  Parameter* norm_mlp_out = nullptr;   // Gemma2 post_feedforward_layernorm
  Linear* linear(int i) { Linear* all[7] = {&q, &k, &v, &o, &gate, &up, &down}; return all[i]; }
};

// What one layer's forward saves for its backward. N = B*T tokens.
struct Decoder::LayerActs {
  float* ln1 = nullptr;     // (N, C) norm1(x)
  float* rstd1 = nullptr;   // (N)
  float* q = nullptr;       // (N, Hq*D) after rope
  float* k = nullptr;       // (N, Hkv*D) after rope
  float* v = nullptr;       // (N, Hkv*D)
  float* att = nullptr;     // (N, Hq*D) attention output
  float* lse = nullptr;     // (B, Hq, T)
  float* o = nullptr;       // (N, C) o_proj output (Gemma2: input of the post-attention norm)
  float* rstd_o = nullptr;  // (N) Gemma2
  float* x_mid = nullptr;   // (N, C) residual after attention
  float* ln2 = nullptr;     // (N, C) norm2(x_mid)
  float* rstd2 = nullptr;   // (N)
  float* gate = nullptr;    // (N, I)
  float* up = nullptr;      // (N, I)
  float* act = nullptr;     // (N, I) act(gate) * up
  float* down = nullptr;    // (N, C) Gemma2: down_proj output, input of the post-feed-forward norm
  float* rstd_down = nullptr;  // (N) Gemma2
  float* saved[7] = {};        // adapters' saved activations, per projection q k v o gate up down
};

// Every buffer of a step, carved from the arena in one layout.
struct Decoder::Plan {
  int64_t B = 0, T = 0, N = 0;
  bool checkpointing = false;
  size_t bytes = 0;
  std::vector<float*> resid;     // L+1 of (N, C): the input of each layer, then the final hidden
  std::vector<LayerActs> acts;   // L, or 1 shared (recomputed) when checkpointing
  float* final_normed = nullptr;  // (N, C)
  float* final_rstd = nullptr;    // (N)
  int32_t* default_positions = nullptr;  // (N) 0..T-1 per row
  // backward scratch
  float *dres = nullptr, *dtmp = nullptr, *dln = nullptr;   // (N, C)
  float *datt = nullptr, *dq = nullptr;                     // (N, Hq*D)
  float *dk = nullptr, *dv = nullptr;                       // (N, Hkv*D)
  float *dact = nullptr, *dgate = nullptr, *dup = nullptr;  // (N, I)
  float* dnormed = nullptr;                                 // (N, C)
  float* recompute_out = nullptr;                           // (N, C) checkpointing only
  float* adapter_scratch = nullptr;
  float* ce_scratch = nullptr;
  int64_t ce_chunk = 0;
  // bf16 storage. bf16_gemm (cpu::bf16_weights_use_bf16_gemm() when planned): the projections'
  // GEMMs take the bf16 weights themselves and weight_scratch holds the widest projection's bf16
  // operands (x, dy) and a block of dW rows; the head's GEMMs run in the fused loss's own scratch.
  // Otherwise weight_scratch holds the largest weight (+ bias) widened to f32, the (V, C) head included.
  bool bf16_gemm = false;
  float* weight_scratch = nullptr;
  float* norm_scratch = nullptr;    // bf16 storage: one norm weight (C) widened to f32
  // bf16 gradients: one norm's (C); and the widened head's (V, C) in f32 before rounding (planned only
  // when the head trains and is widened: bf16 GEMMs add its gradient a block of rows at a time).
  float* norm_grad_scratch = nullptr;
  float* table_grad_scratch = nullptr;
  const int32_t* positions = nullptr;  // of the current batch
};

// Carves buffers from an arena, or (arena == nullptr) only adds up their bytes.
struct Decoder::Take {
  Arena* arena = nullptr;
  size_t bytes = 0;
  float* f(int64_t n) {
    Shape s{std::max<int64_t>(n, 1)};
    bytes += arena_bytes(s, DType::F32);
    return arena ? arena->take(s, DType::F32).f32() : nullptr;
  }
  int32_t* i32(int64_t n) {
    Shape s{std::max<int64_t>(n, 1)};
    bytes += arena_bytes(s, DType::I32);
    return arena ? arena->take(s, DType::I32).data<int32_t>() : nullptr;
  }
};

namespace {

// The adapter on the untied head, if any: the fused loss knows LoRA/DoRA/QLoRA (model/adapters).
LoraAdapter* output_adapter(const Linear& output) {
  if (!output.adapter) return nullptr;
  auto* lora = dynamic_cast<LoraAdapter*>(output.adapter.get());
  check(lora != nullptr, "lm_head", "the fused loss supports only LoRA adapters (LoraAdapter) on the output projection");
  return lora;
}

// Where a kernel writes (+=) a parameter's gradient in f32: the gradient itself, or for a bf16
// gradient a zeroed scratch that grad_end() then adds into it (one rounding per call).
float* grad_begin(Parameter* p, float* scratch) {
  if (!p || !p->trainable) return nullptr;
  if (p->grad.dtype() == DType::F32) return p->grad.f32();
  check(scratch != nullptr, "Decoder", "no f32 scratch planned for the bf16 gradient of " + p->name);
  std::memset(scratch, 0, sizeof(float) * size_t(p->grad.numel()));
  return scratch;
}
void grad_end(Parameter* p, const float* scratch) {
  if (p && p->trainable && p->grad.dtype() != DType::F32) add_to_gradient(p->grad, 0, scratch, p->grad.numel());
}

// A parameter's value as f32: its data, or (bf16 storage) widened into scratch.
const float* as_f32(const Parameter* p, float* scratch) {
  if (p->value.dtype() == DType::F32) return p->value.f32();
  const bf16_t* src = p->value.bf16();
  parallel_for(p->value.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) scratch[i] = bf16_to_f32(src[i]);
  }, 1 << 14);
  return scratch;
}


}  // namespace

// ---------------------------------------------------------------------------------------------
// Parameters

Decoder::Decoder(ModelConfig config, uint64_t seed, DType storage) : config_(std::move(config)), storage_(storage) {
  check(storage == DType::F32 || storage == DType::BF16, "Decoder",
        std::string("weights can be stored in f32 or bf16, not ") + dtype_name(storage));
  build_parameters();
  init_random(seed);
  if (storage_ != DType::F32)
    for (auto& p : params_) p->value = p->value.to(storage_);
  allocate_grads();
}

Decoder::Decoder(ModelConfig config, DType storage, WeightsToLoad) : config_(std::move(config)), storage_(storage) {
  check(storage == DType::F32 || storage == DType::BF16, "Decoder",
        std::string("weights can be stored in f32 or bf16, not ") + dtype_name(storage));
  build_parameters();
  if (storage_ != DType::F32)
    for (auto& p : params_) p->value = Tensor::empty(p->value.shape(), storage_);
  // No gradients yet: the trainer says what trains (a LoRA base never needs them, and allocating a
  // gradient for every weight here would double a loading model's memory for nothing); a backward
  // allocates those still missing.
}

Decoder::~Decoder() = default;

void Decoder::build_parameters() {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, I = c.intermediate_size;
  // The table starts at min(max_position_embeddings, 4096) rows (Llama 3.1's 131072 would be 64 MiB;
  // 4096 where config.json does not say) and grows when a batch reaches further (prepare()).
  const int64_t first_rows = c.max_position_embeddings > 0 ? std::min<int64_t>(c.max_position_embeddings, 4096) : 4096;
  rope_ = std::make_unique<cpu::RopeTable>(c.head_dim, c.rope_theta, c.rope_scaling, first_rows);
  // Gemma: sqrt(hidden) rounded to the dtype of the weights, as HF does (embed_scale.to(weight.dtype)).
  embed_scale_ = c.scale_embeddings ? float(std::sqrt(double(C))) : 1.0f;
  if (storage_ == DType::BF16) embed_scale_ = bf16_to_f32(f32_to_bf16(embed_scale_));
  auto add = [&](const std::string& name, Shape shape) {
    auto p = std::make_unique<Parameter>();
    p->name = name;
    p->value = Tensor::empty(std::move(shape));
    params_.push_back(std::move(p));
    return params_.back().get();
  };
  auto make_linear = [&](Linear& lin, const std::string& module, int64_t in, int64_t out, bool bias) {
    lin.name = module;
    lin.in = in;
    lin.out = out;
    lin.weight = add(module + ".weight", {out, in});
    lin.bias = bias ? add(module + ".bias", {out}) : nullptr;
  };
  embed_ = add("model.embed_tokens.weight", {c.vocab_size, C});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    auto layer = std::make_unique<Layer>();
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    make_linear(layer->q, pre + "self_attn.q_proj", C, c.q_dim(), c.qkv_bias);
    make_linear(layer->k, pre + "self_attn.k_proj", C, c.kv_dim(), c.qkv_bias);
    make_linear(layer->v, pre + "self_attn.v_proj", C, c.kv_dim(), c.qkv_bias);
    make_linear(layer->o, pre + "self_attn.o_proj", c.q_dim(), C, c.o_bias);
    make_linear(layer->gate, pre + "mlp.gate_proj", C, I, c.mlp_bias);
    make_linear(layer->up, pre + "mlp.up_proj", C, I, c.mlp_bias);
    make_linear(layer->down, pre + "mlp.down_proj", I, C, c.mlp_bias);
    layer->norm_attn_in = add(pre + "input_layernorm.weight", {C});
    if (c.sandwich_norms) {
      layer->norm_attn_out = add(pre + "post_attention_layernorm.weight", {C});
      layer->norm_mlp_in = add(pre + "pre_feedforward_layernorm.weight", {C});
      layer->norm_mlp_out = add(pre + "post_feedforward_layernorm.weight", {C});
    } else {
      layer->norm_mlp_in = add(pre + "post_attention_layernorm.weight", {C});
    }
    layers_.push_back(std::move(layer));
  }
  final_norm_ = add("model.norm.weight", {C});
  if (!c.tie_word_embeddings) lm_head_ = add("lm_head.weight", {c.vocab_size, C});
  if (lm_head_) {  // the untied head as a projection, for adapters (LoRA on lm_head)
    output_.name = "lm_head";
    output_.weight = lm_head_;
    output_.in = C;
    output_.out = c.vocab_size;
  }
}

void Decoder::init_random(uint64_t seed) {
  const float norm_identity = 1.0f - config_.norm_weight_offset;
  for (size_t pi = 0; pi < params_.size(); ++pi) {
    Parameter& p = *params_[pi];
    float* x = p.value.f32();
    const int64_t n = p.value.numel();
    if (p.value.rank() == 1 && p.name.find("norm") != std::string::npos) {
      std::fill(x, x + n, norm_identity);
    } else if (p.value.rank() == 1) {
      std::fill(x, x + n, 0.0f);  // biases
    } else {
      // Sum of 4 uniforms (Irwin-Hall): mean 0, variance 4/12; scaled to std 0.02.
      const float scale = 0.02f / std::sqrt(4.0f / 12.0f);
      const uint64_t base = splitmix64(seed * 1000003ull + pi);
      for (int64_t i = 0; i < n; ++i) {
        uint64_t r = splitmix64(base + uint64_t(i));
        float s = 0;
        for (int j = 0; j < 4; ++j) s += float((r >> (16 * j)) & 0xffff) / 65535.0f;
        x[i] = (s - 2.0f) * scale;
      }
    }
  }
}

void Decoder::allocate_grads() {
  for (Parameter* p : parameters()) {
    if (p->trainable && host_gradients_) {
      // The gradient in the value's dtype as stored: bf16 weights train in pure bf16.
      const DType dtype = p->value.defined() ? stored_dtype_of(*p) : DType::F32;
      if (!p->grad.defined() || p->grad.shape() != p->value.shape() || p->grad.dtype() != dtype)
        p->grad = Tensor::zeros(p->value.shape(), dtype);
    } else {
      p->grad = Tensor();
    }
  }
}

namespace {

// config.json ties the head to the embedding, and the checkpoint holds an lm_head.weight as well:
// many save a copy of the embedding there, which the tie then stands for; a head of other values is
// a model the tie would change (transformers keeps such a head untied, with a warning), so it is
// refused, naming both, rather than dropped.
void check_tied_head(const io::SafetensorsCheckpoint& ckpt, const std::string& dir) {
  const io::SafetensorsFile& head_file = ckpt.file_of("lm_head.weight");
  const io::SafetensorsFile& embed_file = ckpt.file_of("model.embed_tokens.weight");
  const io::SafetensorsInfo& head = head_file.info("lm_head.weight");
  const io::SafetensorsInfo& embed = embed_file.info("model.embed_tokens.weight");
  const bool same = head.shape == embed.shape && head.dtype == embed.dtype &&
                    std::memcmp(head_file.address("lm_head.weight"), embed_file.address("model.embed_tokens.weight"),
                                size_t(head.end - head.begin)) == 0;
  if (!same)
    throw Error(head_file.path() + ": tensor lm_head.weight",
                "differs from model.embed_tokens.weight, but " + dir + "/config.json says tie_word_embeddings: true "
                "(the tie would drop this head; transformers keeps it untied): set tie_word_embeddings to false "
                "to train the checkpoint's head, or remove lm_head.weight to tie");
}

}  // namespace

std::unique_ptr<Decoder> Decoder::from_pretrained(const std::string& dir, const LoadOptions& options) {
  if (options.storage != DType::F32 && options.storage != DType::BF16)
    throw Error(dir, std::string("weights can be stored in f32 or bf16, not ") + dtype_name(options.storage));
  if (!fs::is_directory(dir)) throw Error(dir, "not a model directory");
  ModelConfig config = ModelConfig::from_file((fs::path(dir) / "config.json").string());
  io::SafetensorsCheckpoint ckpt = io::SafetensorsCheckpoint::open(dir);
  std::unique_ptr<Decoder> d(new Decoder(config, options.storage, WeightsToLoad{}));
  std::set<std::string> used;
  int64_t mapped_bytes = 0;  // options.map_values: the values that are views of the files
  bool other_dtype = false;  // options.map_values: some held in their file's dtype, not the storage's
  std::map<std::string, std::shared_ptr<const io::SafetensorsFile>> files;  // by path, one each
  for (auto& p : d->params_) {
    if (!ckpt.contains(p->name))
      throw Error(dir + ": tensor " + p->name, "missing from the checkpoint (config.json's " + config.model_type +
                                                   " with " + std::to_string(config.num_layers) + " layers needs it)");
    const io::SafetensorsFile& file = ckpt.file_of(p->name);
    const io::SafetensorsInfo& info = file.info(p->name);
    if (info.shape != p->value.shape())
      throw Error(file.path() + ": tensor " + p->name,
                  "shape " + info.shape.str() + " but config.json implies " + p->value.shape().str());
    Tensor src = file.view(p->name);  // throws naming file and tensor for dtypes core lacks
    if (src.dtype() != DType::F32 && src.dtype() != DType::BF16 && src.dtype() != DType::F16)
      throw Error(file.path() + ": tensor " + p->name,
                  std::string("dtype ") + info.dtype + " is not a floating-point weight type (F32, BF16, F16)");
    used.insert(p->name);
    // Mapped in the file's dtype, whatever the storage's (a copy in the storage's dtype would be the
    // whole model on every rank: Gemma 2's f32 files, or an f16 checkpoint, under bf16 storage).
    if (options.map_values) {
      if (src.dtype() != p->value.dtype()) {
        p->stored_dtype = p->value.dtype();  // read rounded to it (stored_value)
        other_dtype = true;
      }
      p->value = src;  // the mapped bytes themselves (view() copies a tensor the file holds unaligned)
      mapped_bytes += int64_t(src.bytes());
      std::shared_ptr<const io::SafetensorsFile>& shared = files[file.path()];
      if (!shared) shared = std::make_shared<const io::SafetensorsFile>(file);
      d->mapped_[p->name] = shared;
      continue;
    }
    p->value.copy_from(src);
    src = Tensor();
    file.release_pages(p->name);  // copied: the mapped pages need not stay resident beside the copy
  }
  if (options.map_values) {
    int64_t value_bytes = 0;
    for (const auto& p : d->params_) value_bytes += int64_t(p->value.bytes());
    log_info(dir + ": values mapped from the checkpoint files, not copied: " + std::to_string(mapped_bytes) + " of " +
             std::to_string(value_bytes) + " bytes" +
             (!other_dtype ? std::string()
                                      : std::string(" (some held in the files' dtype, read as ") +
                                            dtype_name(options.storage) + ")"));
  }
  if (config.tie_word_embeddings && ckpt.contains("lm_head.weight")) check_tied_head(ckpt, dir);
  int64_t ignored = 0;
  for (const std::string& name : ckpt.names()) {
    if (used.count(name)) continue;
    if (name == "lm_head.weight" && config.tie_word_embeddings) continue;  // tied: the embedding is the head
    ++ignored;
    if (ignored <= 5) log_warn(dir + ": tensor " + name + " is not used by the " + config.model_type + " decoder");
  }
  if (ignored > 5) log_warn(dir + ": " + std::to_string(ignored) + " checkpoint tensors not used in all");
  return d;
}

std::vector<Parameter*> Decoder::parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  for (Linear* lin : linears())
    if (lin->adapter)
      for (Parameter* p : lin->adapter->parameters()) out.push_back(p);
  return out;
}

Parameter& Decoder::parameter(const std::string& name) {
  for (Parameter* p : parameters())
    if (p->name == name) return *p;
  throw Error("parameter " + name, "no such parameter in this " + config_.model_type + " decoder");
}

void Decoder::set_trainable(const std::function<bool(const std::string&)>& trainable) {
  for (Parameter* p : parameters()) p->trainable = trainable(p->name);
  allocate_grads();
  plan_.reset();  // bf16: the gradient scratch depends on what is trainable
}

void Decoder::set_host_gradients(bool on) {
  host_gradients_ = on;
  allocate_grads();
  plan_.reset();  // bf16: the gradient scratch depends on what gets gradients
}

void Decoder::release_values(const std::function<bool(const Parameter&)>& release) {
  for (Parameter* p : parameters()) {
    if (!p->value.defined() || !release(*p)) continue;
    p->value = Tensor();
    mapped_.erase(p->name);  // the file is unmapped once none of its values is held
    if (released_.empty()) released_ = p->name;
  }
}

// A listed value still held as the view it was loaded as: its data inside its file's tensor (a value
// replaced since, by an adapter dropping QLoRA's base or by anything else, is no longer the file's).
bool Decoder::value_is_mapped(const Parameter& p) const {
  auto it = mapped_.find(p.name);
  if (it == mapped_.end() || !p.value.defined()) return false;
  return p.value.raw() == it->second->address(p.name);
}

int64_t Decoder::mapped_value_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : params_)
    if (value_is_mapped(*p)) bytes += int64_t(p->value.bytes());
  return bytes;
}

int64_t Decoder::drop_mapped_pages() {
  int64_t bytes = 0;
  for (const auto& p : params_) {
    if (!value_is_mapped(*p)) {
      mapped_.erase(p->name);  // replaced or released: nothing of the file to drop, nor to keep mapped
      continue;
    }
    mapped_.at(p->name)->release_pages(p->name);
    bytes += int64_t(p->value.bytes());
  }
  return bytes;
}

void Decoder::zero_grad() {
  for (Parameter* p : parameters())
    if (p->trainable && p->grad.defined()) p->grad.fill_zero();
}

std::vector<Linear*> Decoder::linears() {
  std::vector<Linear*> out;
  for (auto& layer : layers_)
    for (int i = 0; i < 7; ++i) out.push_back(layer->linear(i));
  if (lm_head_) out.push_back(&output_);
  return out;
}

Linear& Decoder::linear(const std::string& module_name) {
  for (Linear* lin : linears())
    if (lin->name == module_name) return *lin;
  throw Error("module " + module_name, "no such projection in this " + config_.model_type + " decoder");
}

void Decoder::adapters_changed() {
  plan_.reset();
  allocate_grads();
}

void Decoder::set_activation_checkpointing(bool on) {
  if (on != checkpointing_) plan_.reset();
  checkpointing_ = on;
}

// ---------------------------------------------------------------------------------------------
// Planning

void Decoder::layout(Take& take, int64_t B, int64_t T, Plan& p) const {
  const ModelConfig& c = config_;
  const int64_t N = B * T, C = c.hidden_size, I = c.intermediate_size, QD = c.q_dim(), KD = c.kv_dim();
  const int64_t L = c.num_layers;
  p.B = B;
  p.T = T;
  p.N = N;
  p.checkpointing = checkpointing_;
  p.resid.assign(size_t(L + 1), nullptr);
  for (auto& r : p.resid) r = take.f(N * C);
  p.acts.assign(size_t(checkpointing_ ? std::min<int64_t>(L, 1) : L), LayerActs{});
  for (size_t a = 0; a < p.acts.size(); ++a) {
    LayerActs& s = p.acts[a];
    s.ln1 = take.f(N * C);
    s.rstd1 = take.f(N);
    s.q = take.f(N * QD);
    s.k = take.f(N * KD);
    s.v = take.f(N * KD);
    s.att = take.f(N * QD);
    s.lse = take.f(N * c.num_heads);
    if (c.sandwich_norms) {
      s.o = take.f(N * C);
      s.rstd_o = take.f(N);
      s.down = take.f(N * C);
      s.rstd_down = take.f(N);
    }
    s.x_mid = take.f(N * C);
    s.ln2 = take.f(N * C);
    s.rstd2 = take.f(N);
    s.gate = take.f(N * I);
    s.up = take.f(N * I);
    s.act = take.f(N * I);
    // Adapters' saved floats: the largest over layers when checkpointing shares one set.
    for (int i = 0; i < 7; ++i) {
      int64_t need = 0;
      if (checkpointing_) {
        for (auto& layer : layers_) need = std::max(need, layer->linear(i)->saved_floats(N));
      } else {
        need = layers_[a]->linear(i)->saved_floats(N);
      }
      s.saved[i] = need > 0 ? take.f(need) : nullptr;
    }
  }
  p.final_normed = take.f(N * C);
  p.final_rstd = take.f(N);
  p.default_positions = take.i32(N);
  p.dres = take.f(N * C);
  p.dtmp = take.f(N * C);
  p.dln = take.f(N * C);
  p.datt = take.f(N * QD);
  p.dq = take.f(N * QD);
  p.dk = take.f(N * KD);
  p.dv = take.f(N * KD);
  p.dact = take.f(N * I);
  p.dgate = take.f(N * I);
  p.dup = take.f(N * I);
  p.dnormed = take.f(N * C);
  p.recompute_out = checkpointing_ ? take.f(N * C) : nullptr;
  int64_t adapter_scratch = 0;
  for (auto& layer : layers_)
    for (int i = 0; i < 7; ++i) adapter_scratch = std::max(adapter_scratch, layer->linear(i)->scratch_floats(N));
  p.adapter_scratch = adapter_scratch > 0 ? take.f(adapter_scratch) : nullptr;
  // Chunks of the fused loss: at most 32 Mi floats (128 MiB) of logits at a time — 261 tokens at a
  // 128k vocabulary (the kernel evens the chunks out: 470 labels, two of 235). At 128256 x 512 the
  // head's three GEMMs ran 7-10% faster at ~235 rows than at 130 (the weight gradient's (V, C)
  // accumulator read and written half as often); the step of bench/torchtune's full fine-tune 7%.
  p.ce_chunk = std::clamp<int64_t>((int64_t(1) << 25) / c.vocab_size, 1, std::max<int64_t>(N, 1));
  const LoraAdapter* head_adapter = output_adapter(output_);
  p.bf16_gemm = storage_ == DType::BF16 && cpu::bf16_weights_use_bf16_gemm();
  const bool head_bf16_gemm = p.bf16_gemm && !head_adapter;
  p.ce_scratch = take.f(int64_t(
      head_adapter     ? head_adapter->fused_output_scratch_floats(p.ce_chunk)
      : head_bf16_gemm ? cpu::linear_cross_entropy_bf16_scratch_floats(p.ce_chunk, c.vocab_size, C)
                       : cpu::linear_cross_entropy_scratch_floats(p.ce_chunk, c.vocab_size, C)));
  if (storage_ != DType::F32) {
    // The head (or the tied embedding) widened, unless its GEMMs take it as bf16: an adapted head
    // (LoRA on lm_head) is widened either way, its fused loss computing on an f32 base.
    int64_t widest = head_bf16_gemm ? 0 : c.vocab_size * C;
    // forward_logits runs an adapted head through output_.forward: as bf16, x (N, C) rounded (its
    // backward is the fused loss's, never Linear::backward).
    if (head_adapter)
      widest = std::max(widest, p.bf16_gemm ? cpu::bf16_floats(N * C) : output_.weight_scratch_floats(N, storage_));
    for (auto& layer : layers_)
      for (int i = 0; i < 7; ++i) widest = std::max(widest, layer->linear(i)->weight_scratch_floats(N, storage_));
    p.weight_scratch = take.f(widest);
    p.norm_scratch = take.f(C);
    p.norm_grad_scratch = take.f(C);
    const Parameter* head = lm_head_ ? lm_head_ : embed_;
    p.table_grad_scratch = head->trainable && !head_bf16_gemm ? take.f(c.vocab_size * C) : nullptr;
  }
  p.bytes = take.bytes;
}

size_t Decoder::planned_activation_bytes(int64_t B, int64_t T) const {
  Take take;
  Plan p;
  layout(take, B, T, p);
  return take.bytes;
}

Decoder::Plan& Decoder::prepare(const Batch& batch) {
  check(batch.B > 0 && batch.T > 0, "Decoder", "empty batch (B=" + std::to_string(batch.B) + ", T=" +
                                                   std::to_string(batch.T) + ")");
  check(batch.tokens != nullptr, "Decoder", "batch without tokens");
  const bool bf16_gemm = storage_ == DType::BF16 && cpu::bf16_weights_use_bf16_gemm();
  if (!plan_ || plan_->B != batch.B || plan_->T != batch.T || plan_->checkpointing != checkpointing_ ||
      plan_->bf16_gemm != bf16_gemm) {
    const size_t need = planned_activation_bytes(batch.B, batch.T);
    if (!arena_ || arena_->capacity() < need) {
      // Growing (e.g. generation adding a token a call): leave a quarter of headroom so that a
      // sequence of slightly larger batches reallocates only a few times.
      const size_t bytes = arena_ ? std::max(need, arena_->capacity() + arena_->capacity() / 4) : need;
      arena_.reset();  // free the old block before taking the new one
      arena_ = std::make_unique<Arena>(bytes);
      log_info("decoder: activation arena planned at " + std::to_string(bytes) + " bytes (" +
               std::to_string(double(bytes) / (1 << 20)) + " MiB) for B=" + std::to_string(batch.B) +
               " T=" + std::to_string(batch.T) + (checkpointing_ ? " with activation checkpointing" : ""));
    }
    arena_->reset();
    plan_ = std::make_unique<Plan>();
    Take take{arena_.get()};
    layout(take, batch.B, batch.T, *plan_);
    for (int64_t b = 0; b < batch.B; ++b)
      for (int64_t t = 0; t < batch.T; ++t) plan_->default_positions[b * batch.T + t] = int32_t(t);
  }
  plan_->positions = batch.positions ? batch.positions : plan_->default_positions;
  int32_t max_position = 0;
  for (int64_t n = 0; n < plan_->N; ++n) {
    const int32_t pos = plan_->positions[n];
    if (pos < 0) throw Error("Decoder: position " + std::to_string(n), "negative rotary position " + std::to_string(pos));
    max_position = std::max(max_position, pos);
  }
  if (max_position >= rope_->max_positions()) {
    const int64_t rows = std::max<int64_t>(int64_t(max_position) + 1, 2 * rope_->max_positions());
    rope_ = std::make_unique<cpu::RopeTable>(config_.head_dim, config_.rope_theta, config_.rope_scaling, rows);
  }
  return *plan_;
}

// ---------------------------------------------------------------------------------------------
// Forward and backward

void Decoder::layer_forward(size_t l, const LayerActs& a, const float* x_in, float* x_out, const Plan& p) {
  const ModelConfig& c = config_;
  Layer& L = *layers_[l];
  const int64_t N = p.N, C = c.hidden_size, I = c.intermediate_size;
  const float eps = c.rms_norm_eps, off = c.norm_weight_offset;
  // attention block
  cpu::rmsnorm_forward(a.ln1, a.rstd1, x_in, as_f32(L.norm_attn_in, p.norm_scratch), N, C, eps, off);
  L.q.forward(a.q, a.ln1, N, a.saved[0], p.weight_scratch);
  L.k.forward(a.k, a.ln1, N, a.saved[1], p.weight_scratch);
  L.v.forward(a.v, a.ln1, N, a.saved[2], p.weight_scratch);
  cpu::rope_forward(a.q, p.positions, *rope_, N, c.num_heads, c.head_dim);
  cpu::rope_forward(a.k, p.positions, *rope_, N, c.num_kv_heads, c.head_dim);
  if (cached_sequences_) {
    // Generation: each sequence's keys and values join its cache, its queries read all of that cache.
    const int64_t q_row = c.num_heads * c.head_dim, kv_row = c.num_kv_heads * c.head_dim;
    int64_t row = 0;  // the sequence's first token among the N
    for (const CachedSequence& seq : *cached_sequences_) {
      KvCache& cache = *seq.cache;
      cache.write(int64_t(l), a.k + row * kv_row, a.v + row * kv_row, seq.count);
      cpu::CachedAttentionShape s{seq.count, cache.length() + seq.count, c.num_heads, c.num_kv_heads, c.head_dim,
                                  c.attention_scale, c.sliding_window[l], c.attn_logit_softcap};
      cpu::cached_attention_forward(a.att + row * q_row, a.q + row * q_row, cache.keys(int64_t(l)),
                                    cache.values(int64_t(l)), s);
      row += seq.count;
    }
  } else {
    cpu::AttentionShape s{p.B, p.T, c.num_heads, c.num_kv_heads, c.head_dim, c.attention_scale,
                          c.sliding_window[l], c.attn_logit_softcap};
    cpu::attention_forward(a.att, a.lse, a.q, a.k, a.v, doc_ids_, s);
  }
  if (c.sandwich_norms) {
    L.o.forward(a.o, a.att, N, a.saved[3], p.weight_scratch);
    cpu::rmsnorm_forward(a.x_mid, a.rstd_o, a.o, as_f32(L.norm_attn_out, p.norm_scratch), N, C, eps, off);
  } else {
    L.o.forward(a.x_mid, a.att, N, a.saved[3], p.weight_scratch);
  }
  cpu::add_inplace(a.x_mid, x_in, N * C);  // h = x + attn
  // MLP block
  cpu::rmsnorm_forward(a.ln2, a.rstd2, a.x_mid, as_f32(L.norm_mlp_in, p.norm_scratch), N, C, eps, off);
  L.gate.forward(a.gate, a.ln2, N, a.saved[4], p.weight_scratch);
  L.up.forward(a.up, a.ln2, N, a.saved[5], p.weight_scratch);
  if (c.activation == Activation::SiLU) cpu::swiglu_forward(a.act, a.gate, a.up, N * I);
  else cpu::geglu_tanh_forward(a.act, a.gate, a.up, N * I);
  if (c.sandwich_norms) {
    L.down.forward(a.down, a.act, N, a.saved[6], p.weight_scratch);
    cpu::rmsnorm_forward(x_out, a.rstd_down, a.down, as_f32(L.norm_mlp_out, p.norm_scratch), N, C, eps, off);
  } else {
    L.down.forward(x_out, a.act, N, a.saved[6], p.weight_scratch);
  }
  cpu::add_inplace(x_out, a.x_mid, N * C);  // y = h + mlp
}

// dres: (N, C) the gradient of the layer's output on entry, of its input on exit.
void Decoder::layer_backward(size_t l, const LayerActs& a, const float* x_in, float* dres, const Plan& p) {
  const ModelConfig& c = config_;
  Layer& L = *layers_[l];
  const int64_t N = p.N, C = c.hidden_size, I = c.intermediate_size;
  const float off = c.norm_weight_offset;
  float* scratch = p.adapter_scratch;
  // Undo y = h + [post_ff_norm](down(act(gate(n)) * up(n))), n = norm2(h)
  const float* dy_down = dres;
  if (c.sandwich_norms) {
    cpu::rmsnorm_backward(p.dtmp, grad_begin(L.norm_mlp_out, p.norm_grad_scratch), dres, a.down,
                          as_f32(L.norm_mlp_out, p.norm_scratch), a.rstd_down, N, C, off);
    grad_end(L.norm_mlp_out, p.norm_grad_scratch);
    dy_down = p.dtmp;
  }
  L.down.backward(p.dact, dy_down, a.act, N, a.saved[6], scratch, p.weight_scratch, false);
  if (c.activation == Activation::SiLU) cpu::swiglu_backward(p.dgate, p.dup, p.dact, a.gate, a.up, N * I);
  else cpu::geglu_tanh_backward(p.dgate, p.dup, p.dact, a.gate, a.up, N * I);
  L.gate.backward(p.dln, p.dgate, a.ln2, N, a.saved[4], scratch, p.weight_scratch, false);
  L.up.backward(p.dln, p.dup, a.ln2, N, a.saved[5], scratch, p.weight_scratch, true);
  cpu::rmsnorm_backward(p.dtmp, grad_begin(L.norm_mlp_in, p.norm_grad_scratch), p.dln, a.x_mid,
                        as_f32(L.norm_mlp_in, p.norm_scratch), a.rstd2, N, C, off);
  grad_end(L.norm_mlp_in, p.norm_grad_scratch);
  cpu::add_inplace(dres, p.dtmp, N * C);  // dres = d h
  // Undo h = x + [post_attn_norm](o(attention(rope(q(n)), rope(k(n)), v(n)))), n = norm1(x)
  const float* dy_o = dres;
  if (c.sandwich_norms) {
    cpu::rmsnorm_backward(p.dtmp, grad_begin(L.norm_attn_out, p.norm_grad_scratch), dres, a.o,
                          as_f32(L.norm_attn_out, p.norm_scratch), a.rstd_o, N, C, off);
    grad_end(L.norm_attn_out, p.norm_grad_scratch);
    dy_o = p.dtmp;
  }
  L.o.backward(p.datt, dy_o, a.att, N, a.saved[3], scratch, p.weight_scratch, false);
  cpu::AttentionShape s{p.B, p.T, c.num_heads, c.num_kv_heads, c.head_dim, c.attention_scale,
                        c.sliding_window[l], c.attn_logit_softcap};
  cpu::attention_backward(p.dq, p.dk, p.dv, p.datt, a.q, a.k, a.v, a.att, a.lse, doc_ids_, s);
  cpu::rope_backward(p.dq, p.positions, *rope_, N, c.num_heads, c.head_dim);
  cpu::rope_backward(p.dk, p.positions, *rope_, N, c.num_kv_heads, c.head_dim);
  // The input gradient is needed below this layer, or for this layer's input norm weight.
  const bool need_dx = needs_grad_below_[l] || L.norm_attn_in->trainable;
  float* dln = need_dx ? p.dln : nullptr;
  L.q.backward(dln, p.dq, a.ln1, N, a.saved[0], scratch, p.weight_scratch, false);
  L.k.backward(dln, p.dk, a.ln1, N, a.saved[1], scratch, p.weight_scratch, true);
  L.v.backward(dln, p.dv, a.ln1, N, a.saved[2], scratch, p.weight_scratch, true);
  if (need_dx) {
    cpu::rmsnorm_backward(p.dtmp, grad_begin(L.norm_attn_in, p.norm_grad_scratch), p.dln, x_in,
                          as_f32(L.norm_attn_in, p.norm_scratch), a.rstd1, N, C, off);
    grad_end(L.norm_attn_in, p.norm_grad_scratch);
    cpu::add_inplace(dres, p.dtmp, N * C);  // dres = d x
  }
}

void Decoder::embed_forward(const Batch& batch, Plan& p, float* x) {
  const int64_t C = config_.hidden_size, V = config_.vocab_size;
  if (embed_->value.dtype() == DType::F32) {
    cpu::embedding_forward(x, batch.tokens, embed_->value.f32(), p.N, C, V, embed_scale_);
    return;
  }
  // bf16 table: gather and widen the rows (out = table[ids] * scale, as the f32 kernel does).
  for (int64_t n = 0; n < p.N; ++n)
    if (batch.tokens[n] < 0 || batch.tokens[n] >= V)
      throw Error("Decoder: token " + std::to_string(n), "id " + std::to_string(batch.tokens[n]) +
                                                              " outside the vocabulary [0, " + std::to_string(V) + ")");
  const bf16_t* table = embed_->value.bf16();
  const float scale = embed_scale_;
  parallel_for(p.N, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const bf16_t* row = table + int64_t(batch.tokens[n]) * C;
      for (int64_t i = 0; i < C; ++i) x[n * C + i] = bf16_to_f32(row[i]) * scale;
    }
  }, 16);
}

void Decoder::check_computable() const {
  check(released_.empty(), "Decoder", "cannot compute: the value of " + released_ +
                                          " was released (its steps run elsewhere, release_values)");
  // A value mapped in its file's other dtype (LoadOptions::map_values): the kernels read the storage
  // dtype. Sharded data parallelism replaces them all with gathered copies before any compute.
  for (const auto& param : params_)
    if (value_in_other_dtype(*param))
      throw Error("Decoder", "cannot compute: the value of " + param->name + " is mapped in its checkpoint file's dtype, not " +
                                 dtype_name(storage_) + " (LoadOptions::map_values: a model whose values are read elsewhere first)");
}

void Decoder::head_logits(float* logits, const float* normed, int64_t rows, const Plan& p) {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, V = c.vocab_size;
  Parameter* head = lm_head_ ? lm_head_ : embed_;
  if (output_adapter(output_)) {
    std::vector<float> saved(size_t(std::max<int64_t>(1, output_.saved_floats(rows))));
    output_.forward(logits, normed, rows, saved.data(), p.weight_scratch);
  } else if (p.bf16_gemm) {
    // ce_chunk rows at a time, rounded to bf16 in the fused loss's scratch (it holds ce_chunk * V floats).
    bf16_t* rows16 = cpu::as_bf16(p.ce_scratch);
    for (int64_t n0 = 0; n0 < rows; n0 += p.ce_chunk) {
      const int64_t chunk = std::min(p.ce_chunk, rows - n0);
      cpu::round_to_bf16(rows16, normed + n0 * C, chunk * C);
      cpu::gemm_bf16(false, true, chunk, V, C, 1.0f, rows16, head->value.bf16(), 0.0f, logits + n0 * V);
    }
  } else if (head->value.dtype() == DType::BF16 && rows <= cpu::kWideningRowsMax) {
    cpu::linear_forward_widening_bf16(logits, normed, head->value.bf16(), nullptr, rows, C, V);  // decoding
  } else {
    cpu::gemm(false, true, rows, V, C, 1.0f, normed, as_f32(head, p.weight_scratch), 0.0f, logits);
  }
  if (c.final_logit_softcap > 0) cpu::softcap_forward(logits, rows * V, c.final_logit_softcap);
}

LossResult Decoder::run(const Batch& batch, bool backward, float grad_scale, float* logits) {
  const ModelConfig& c = config_;
  check_computable();
  check(!backward || host_gradients_, "Decoder", "no backward: this model keeps no host gradients (set_host_gradients)");
  Plan& p = prepare(batch);
  if (!logits) check(batch.labels != nullptr, "Decoder", "a loss needs labels");
  // Gradients of trainable parameters that have none yet (a no-op once they exist); sharded data
  // parallelism hands each layer's gradients in just in time through its hooks instead.
  if (backward && !hooks_.before_backward) allocate_grads();
  const int64_t N = p.N, C = c.hidden_size, V = c.vocab_size, L = c.num_layers;
  doc_ids_ = batch.doc_ids;

  // Which layers still need gradients below them (a frozen bottom stops the backward early).
  needs_grad_below_.assign(size_t(L) + 1, false);
  bool below = embed_->trainable;
  for (int64_t l = 0; l <= L; ++l) {
    needs_grad_below_[size_t(l)] = below;
    if (l == L) break;
    Layer& layer = *layers_[size_t(l)];
    for (int i = 0; i < 7; ++i) {
      const Linear* lin = layer.linear(i);
      if (lin->weight->trainable || (lin->bias && lin->bias->trainable) || lin->adapter) below = true;
    }
    for (Parameter* n : {layer.norm_attn_in, layer.norm_attn_out, layer.norm_mlp_in, layer.norm_mlp_out})
      if (n && n->trainable) below = true;
  }

  {
    trace::Span span("forward", "embedding");
    embed_forward(batch, p, p.resid[0]);
  }
  for (int64_t l = 0; l < L; ++l) {
    if (hooks_.before_forward) hooks_.before_forward(l);
    trace::Span span("forward", "layer", l);
    layer_forward(size_t(l), p.acts[checkpointing_ ? 0 : size_t(l)], p.resid[size_t(l)], p.resid[size_t(l) + 1], p);
    if (hooks_.after_forward) hooks_.after_forward(l);
  }
  std::optional<trace::Span> head_span;
  head_span.emplace("forward", backward ? "norm, output projection and loss (with their backward)" : "norm, output projection and loss");
  cpu::rmsnorm_forward(p.final_normed, p.final_rstd, p.resid[size_t(L)], as_f32(final_norm_, p.norm_scratch), N, C,
                       c.rms_norm_eps, c.norm_weight_offset);
  if (logits) {  // (N, V)
    head_logits(logits, p.final_normed, N, p);
    return {};
  }
  Parameter* head = lm_head_ ? lm_head_ : embed_;
  LoraAdapter* head_adapter = output_adapter(output_);
  const bool head_bf16_gemm = p.bf16_gemm && !head_adapter;  // as planned (layout)
  // (V, C) f32, unless multiplied as bf16; a QLoRA head keeps only its NF4 copy (in the adapter)
  const float* head_w = head->value.defined() && !head_bf16_gemm ? as_f32(head, p.weight_scratch) : nullptr;
  LossResult r;
  if (head_adapter) {
    r.loss_sum = head_adapter->fused_output_cross_entropy(backward ? p.dnormed : nullptr, &r.n_valid, p.final_normed,
                                                          head_w, batch.labels, N, c.final_logit_softcap, grad_scale,
                                                          backward, p.ce_chunk, p.ce_scratch);
  } else if (head_bf16_gemm) {
    // The gradient added by the kernel: in place when f32 (a sharded reduction's flat), else a block
    // of vocabulary rows at a time, rounded once per block and chunk.
    const bool head_grad = backward && head->trainable;
    float* dw = head_grad && head->grad.dtype() == DType::F32 ? head->grad.f32() : nullptr;
    bf16_t* dw16 = head_grad && head->grad.dtype() == DType::BF16 ? head->grad.bf16() : nullptr;
    r.loss_sum = cpu::linear_cross_entropy_bf16(backward ? p.dnormed : nullptr, dw, dw16, &r.n_valid, p.final_normed,
                                                head->value.bf16(), batch.labels, N, C, V, c.final_logit_softcap,
                                                grad_scale, p.ce_chunk, p.ce_scratch);
  } else {
    r.loss_sum = cpu::linear_cross_entropy(backward ? p.dnormed : nullptr,
                                           backward ? grad_begin(head, p.table_grad_scratch) : nullptr,
                                           &r.n_valid, p.final_normed, head_w, batch.labels, N, C, V,
                                           c.final_logit_softcap, grad_scale, p.ce_chunk, p.ce_scratch);
  }
  if (!backward) return r;
  if (!head_bf16_gemm) grad_end(head, p.table_grad_scratch);
  head_span.reset();

  const bool any_below = needs_grad_below_[size_t(L)];
  if (!any_below && !final_norm_->trainable) return r;
  cpu::rmsnorm_backward(p.dres, grad_begin(final_norm_, p.norm_grad_scratch), p.dnormed, p.resid[size_t(L)],
                        as_f32(final_norm_, p.norm_scratch), p.final_rstd, N, C, c.norm_weight_offset);
  grad_end(final_norm_, p.norm_grad_scratch);
  for (int64_t l = L - 1; l >= 0; --l) {
    if (!needs_grad_below_[size_t(l) + 1]) break;  // nothing trainable in this layer or below
    const LayerActs& a = p.acts[checkpointing_ ? 0 : size_t(l)];
    if (hooks_.before_backward) hooks_.before_backward(l);
    trace::Span span("backward", "layer", l);  // with its recomputed forward under checkpointing
    if (checkpointing_) layer_forward(size_t(l), a, p.resid[size_t(l)], p.recompute_out, p);
    layer_backward(size_t(l), a, p.resid[size_t(l)], p.dres, p);
    if (hooks_.after_backward) hooks_.after_backward(l);
  }
  if (embed_->trainable && embed_->grad.dtype() == DType::F32)
    cpu::embedding_backward(embed_->grad.f32(), p.dres, batch.tokens, N, C, embed_scale_);
  else if (embed_->trainable)
    embed_backward_bf16(batch, p);
  return r;
}

// A bf16 embedding gradient: each row this batch touches summed in f32 over its tokens, in token
// order as cpu::embedding_backward adds them (into dtmp, (rows touched, C), free by now), then added
// into the gradient with one rounding. No (V, C) buffer.
void Decoder::embed_backward_bf16(const Batch& batch, Plan& p) {
  const int64_t N = p.N, C = config_.hidden_size;
  std::vector<int64_t> order(static_cast<size_t>(N));  // token indices grouped by id, each in token order
  for (int64_t n = 0; n < N; ++n) order[size_t(n)] = n;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return batch.tokens[a] < batch.tokens[b]; });
  std::vector<int64_t> starts;  // where each id's group begins in order, then N
  for (int64_t k = 0; k < N; ++k)
    if (k == 0 || batch.tokens[order[size_t(k)]] != batch.tokens[order[size_t(k) - 1]]) starts.push_back(k);
  starts.push_back(N);
  const float scale = embed_scale_;
  parallel_for(int64_t(starts.size()) - 1, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      float* sum = p.dtmp + g * C;  // (C)
      std::fill(sum, sum + C, 0.0f);
      for (int64_t k = starts[size_t(g)]; k < starts[size_t(g) + 1]; ++k) {
        const float* src = p.dres + order[size_t(k)] * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) sum[c] += src[c] * scale;
      }
      const int64_t id = batch.tokens[order[size_t(starts[size_t(g)])]];
      cpu::add_rounded_to_bf16(embed_->grad.bf16() + id * C, sum, C);
    }
  }, 4);
}

LossResult Decoder::forward_backward(const Batch& batch, float grad_scale) { return run(batch, true, grad_scale, nullptr); }

LossResult Decoder::forward_loss(const Batch& batch) { return run(batch, false, 1.0f, nullptr); }

Tensor Decoder::forward_logits(const Batch& batch) {
  Tensor logits = Tensor::empty({batch.B, batch.T, config_.vocab_size});
  run(batch, false, 1.0f, logits.f32());
  return logits;
}

void Decoder::forward_cached(const int32_t* tokens, const std::vector<CachedSequence>& sequences, float* last_logits) {
  const ModelConfig& c = config_;
  const int64_t C = c.hidden_size, L = c.num_layers, S = int64_t(sequences.size());
  check_computable();
  check(S > 0, "Decoder", "a cached pass needs at least one sequence");
  std::vector<int32_t> positions;  // (N) each sequence's past .. past + count - 1
  for (int64_t i = 0; i < S; ++i) {
    const CachedSequence& seq = sequences[size_t(i)];
    auto which = [&] { return "sequence " + std::to_string(i) + " of a cached pass"; };  // for an error only
    if (seq.cache == nullptr || seq.count <= 0) throw Error("Decoder", which() + " has no cache or no tokens");
    if (seq.cache->num_layers() != L || seq.cache->row_floats() != c.num_kv_heads * c.head_dim)
      throw Error("Decoder", "the KV cache of " + which() + " was made for another model shape");
    for (int64_t j = 0; j < i; ++j)
      if (sequences[size_t(j)].cache == seq.cache)
        throw Error("Decoder", which() + " shares its cache with sequence " + std::to_string(j));
    seq.cache->reserve(seq.count);
    for (int64_t t = 0; t < seq.count; ++t) positions.push_back(int32_t(seq.cache->length() + t));
  }
  const int64_t N = int64_t(positions.size());
  const Batch batch{tokens, nullptr, positions.data(), nullptr, 1, N};
  Plan& p = prepare(batch);
  doc_ids_ = nullptr;
  cached_sequences_ = &sequences;
  struct Forget {
    const std::vector<CachedSequence>*& sequences;
    ~Forget() { sequences = nullptr; }
  } forget{cached_sequences_};
  embed_forward(batch, p, p.resid[0]);
  for (int64_t l = 0; l < L; ++l) {
    if (hooks_.before_forward) hooks_.before_forward(l);
    layer_forward(size_t(l), p.acts[checkpointing_ ? 0 : size_t(l)], p.resid[size_t(l)], p.resid[size_t(l) + 1], p);
    if (hooks_.after_forward) hooks_.after_forward(l);
  }
  for (const CachedSequence& seq : sequences) seq.cache->advance(seq.count);
  // Only each sequence's last token's logits: its hidden state gathered into resid[0] (free by now,
  // (S, C) of its (N, C)), the final norm over those S rows, then the head.
  int64_t last = -1;
  for (int64_t i = 0; i < S; ++i) {
    last += sequences[size_t(i)].count;
    std::memcpy(p.resid[0] + i * C, p.resid[size_t(L)] + last * C, sizeof(float) * size_t(C));
  }
  cpu::rmsnorm_forward(p.final_normed, p.final_rstd, p.resid[0], as_f32(final_norm_, p.norm_scratch), S, C,
                       c.rms_norm_eps, c.norm_weight_offset);
  head_logits(last_logits, p.final_normed, S, p);
}

void Decoder::forward_cached(const int32_t* tokens, int64_t n, KvCache& cache, float* last_logits) {
  forward_cached(tokens, std::vector<CachedSequence>{{&cache, n}}, last_logits);
}

}  // namespace ktune::model
