// Parameter (a named, HF-named tensor with its gradient and trainable flag) and Linear, the one
// projection type of the decoder (q, k, v, o, gate, up, down): y = x @ W^T + b, W (out, in).
// Linear is the extension point for adapters: a LinearAdapter attached to it (LoRA A/B, DoRA
// magnitude, an NF4 base, ...) gets its own saved activations planned into the decoder's arena and
// is called in the forward and backward of that projection; the decoder knows nothing else of it.
// It deliberately implements no adapter itself (the trainer's adapters live with the trainer).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ktune::model {

struct Parameter {
  std::string name;  // the HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Tensor value;      // f32, or bf16 when the decoder stores its weights in bf16
  // Same shape; undefined while frozen. The value's dtype (bf16 weights have bf16 gradients: pure-bf16
  // training), except where sharded data parallelism points a bf16 weight's gradient at an f32 flat
  // for the span of one reduction. Kernels write f32; add_to_gradient() stores it either way.
  Tensor grad;
  bool trainable = true;
  // Set where `value` holds another dtype than the model keeps this parameter in: a value mapped
  // read-only from a checkpoint file that holds it so (LoadOptions::map_values: Gemma 2's f32 files
  // under bf16 storage, or an f16 checkpoint's), instead of a converted copy on every rank. Its readers take the value as
  // stored (stored_value, read_stored_f32): rounded as a copy would have been.
  std::optional<DType> stored_dtype;
};

// The dtype the model keeps p in: stored_dtype where set, else its value's.
DType stored_dtype_of(const Parameter& p);
// Whether p's value holds another dtype than the one the model keeps it in (stored_dtype).
bool value_in_other_dtype(const Parameter& p);
// p's value as the model keeps it: the value itself, or a copy rounded to stored_dtype.
Tensor stored_value(const Parameter& p);
// Elements [first, first + count) of p's value as stored, widened to f32 into out: a chunk at a
// time, for readers of a whole weight that need no copy of it (QLoRA's quantiser).
void read_stored_f32(const Parameter& p, int64_t first, int64_t count, float* out);

// grad[begin, begin + n) += g (n floats, f32). An f32 gradient adds in place; a bf16 one is widened,
// summed in f32 and rounded to nearest even once per call, so a caller that sums one micro-batch's
// contributions in f32 first rounds once per micro-batch.
void add_to_gradient(const Tensor& grad, int64_t begin, const float* g, int64_t n);

struct Linear;

// What an adapter adds to a projection. Sizes are floats; the decoder plans saved_floats(N) per call
// in its activation arena (per layer, or recomputed under activation checkpointing) and
// scratch_floats(N) once for the backward.
class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  // The adapter's own parameters (named as PEFT names them); the decoder lists them with its own.
  virtual std::vector<Parameter*> parameters() = 0;
  virtual int64_t saved_floats(int64_t N) const { return 0; }
  virtual int64_t scratch_floats(int64_t N) const { return 0; }
  // true: the adapter computes the whole projection itself (e.g. an NF4 or DoRA base) and the plain
  // base GEMMs are skipped, in both forward and backward.
  virtual bool replaces_base() const { return false; }
  // y (N, out): holds base(x) (+ bias) unless replaces_base(); the adapter adds to or rewrites it.
  // x (N, in); saved: saved_floats(N) floats, kept until the backward.
  virtual void forward(float* y, const float* x, int64_t N, const Linear& base, float* saved) = 0;
  // dy (N, out). dx (N, in) or nullptr: ADD the adapter's part (the base's part is already there
  // unless replaces_base(), in which case the adapter must add all of it). Accumulates (+=) the
  // gradients of its own trainable parameters.
  virtual void backward(float* dx, const float* dy, const float* x, int64_t N, const Linear& base,
                        const float* saved, float* scratch) = 0;
};

struct Linear {
  std::string name;              // HF module name, e.g. "model.layers.0.self_attn.q_proj"
  Parameter* weight = nullptr;   // (out, in)
  Parameter* bias = nullptr;     // (out) or nullptr
  int64_t in = 0, out = 0;
  std::shared_ptr<LinearAdapter> adapter;  // attached by the trainer; null = plain projection

  int64_t saved_floats(int64_t N) const { return adapter ? adapter->saved_floats(N) : 0; }
  int64_t scratch_floats(int64_t N) const { return adapter ? adapter->scratch_floats(N) : 0; }
  // A bf16-stored weight is multiplied in one of two ways (cpu::bf16_weights_use_bf16_gemm()):
  // as bf16 (multiplies_bf16(): the GEMMs take W itself and x or dy rounded to bf16 in weight_scratch,
  // accumulating in f32), or widened to an f32 copy in weight_scratch (CPUs without bf16 units).
  bool multiplies_bf16() const;
  // Floats of weight_scratch the projection needs for N rows with its weight stored in `storage` (the
  // decoder's: a sharded weight's value may be released while the decoder plans): 0 for f32; widened,
  // the weight and bias, out*in + out; as bf16, x and dy in bf16 (N*in + N*out halves) + a block of dW
  // rows + db.
  int64_t weight_scratch_floats(int64_t N, DType storage) const;
  // The weight (out, in) and bias (out, or nullptr) as f32: the stored data, or (bf16 storage) widened
  // into weight_scratch.
  const float* weight_f32(float* weight_scratch) const;
  const float* bias_f32(float* weight_scratch) const;
  // y (N, out) = x (N, in) @ W^T + b  (+ adapter)
  void forward(float* y, const float* x, int64_t N, float* saved, float* weight_scratch) const;
  // dx (N, in) overwritten (or added when accumulate_dx), nullptr when no input gradient is needed;
  // dW, db accumulate when the weight/bias are trainable (a frozen weight costs no GEMM). bf16
  // gradients are summed in f32 and added with one rounding per call: widened, dW (db) whole in
  // weight_scratch, then W widened into the same scratch for dx; as bf16, dW a block of rows at a time
  // (cpu::linear_backward_weight_bf16_blocks: one rounding per block and call), so no (out, in) f32 buffer.
  void backward(float* dx, const float* dy, const float* x, int64_t N, const float* saved, float* scratch,
                float* weight_scratch, bool accumulate_dx) const;

 private:
  void forward_bf16(float* y, const float* x, int64_t N, float* weight_scratch) const;
  void backward_bf16(float* dx, const float* dy, const float* x, int64_t N, float* weight_scratch,
                     bool accumulate_dx) const;
};

}  // namespace ktune::model
