// ShardedDataParallel: FSDP / ZeRO-3 for the decoder over a dist::ProcessGroup. Each rank keeps
// only 1/W of every trainable parameter, of its gradient and (through the optimizer, which is
// given the shards) of its AdamW moments. The trainable parameters are grouped in units, one per
// decoder layer plus one for the rest (embeddings, final norm, output projection), each a flat
// buffer laid out by FlatShardLayout (sharded_layout.h).
//
// A step, per micro-batch:
//   root unit: all-gather values, zero full grads             (kept for the whole call: the
//   layer l forward:  all-gather l → forward → free l          embedding and the output
//                     (kept until its backward when             projection are used at both ends)
//                      reshard_after_forward is false)
//   layer l backward: all-gather l (if freed) → backward into full grads → reduce-scatter them
//                     into l's gradient shard (+=, so micro-batches accumulate) → free l
//   root unit: reduce-scatter grads, free
// then the recipe scales, clips (global norm over the shards) and steps AdamW on the shards.
// Frozen parameters (the LoRA base) are sharded the same way, without gradients or optimizer
// state: gathered with their unit, never reduced. The adapters are sharded like any trainable
// parameter. A QLoRA base (NF4 inside its adapter) stays replicated.
// dtype=bf16: a flat holds its parameters' dtype. bf16 flats (values, gradient shards, moments)
// are bf16 and gather as bf16; a unit's full gradients are f32 for the span of its backward and
// reduce-scatter in f32 (one unit at a time), then are rounded once into the bf16 gradient shard.
// element_origins() tells AdamW which model parameter each shard element belongs to, so that the
// stochastic rounding of the update does not depend on W.
// Checkpoints: the optimizer state is gathered into the same per-parameter "exp_avg.<name>" tensors
// an unsharded run saves, so a checkpoint does not depend on W; the values and the moments are
// streamed unit by unit (stream_optimizer_state, stream_full_parameters) as rank 0 writes them, so
// that rank 0 holds one unit at a time; a LoRA run's adapters are gathered whole and its frozen base
// streamed unit by unit (gather_trainable_parameters, stream_frozen_parameters): its merged model is
// made of each unit's base and the adapters as they come.
//
// It deliberately does not overlap communication with compute (Gloo collectives block; the
// gather of layer l+1 could be prefetched on another thread), or offload to the CPU.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "dist/process_group.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "train/optimizer.h"
#include "train/sharded_layout.h"

namespace ktune::train {

struct ShardingOptions {
  bool reshard_after_forward = true;  // fsdp_reshard_after_forward
};

// Bytes one rank holds between steps, and at most on top of that during a step.
struct ShardedMemory {
  int64_t sharded_params = 0;     // Σ over units of the trainable shard (its dtype), incl. padding
  int64_t sharded_frozen = 0;     // Σ over units of the frozen shard (its dtype), incl. padding
  int64_t replicated_frozen = 0;  // frozen parameters left whole on every rank (not f32 or bf16)
  int64_t gradient_shards = 0;    // in the shards' dtype
  int64_t largest_unit_full = 0;  // bytes of one gathered layer (values, trainable + frozen)
  int64_t root_unit_full = 0;     // bytes of the gathered root unit (values, trainable + frozen)
};

class ShardedDataParallel {
 public:
  // Takes the trainable parameters (f32 or bf16 values as the model stores them, identical on every
  // rank; a value mapped in its checkpoint file's other dtype is read as stored, only this rank's part
  // of it) of `model`, keeps this rank's shards, frees the full values and gradients, and installs the
  // model's layer hooks.
  ShardedDataParallel(model::Decoder& model, const std::vector<model::Parameter*>& trainable, dist::ProcessGroup& group,
                      ShardingOptions options);
  ~ShardedDataParallel();  // removes the hooks
  ShardedDataParallel(const ShardedDataParallel&) = delete;
  ShardedDataParallel& operator=(const ShardedDataParallel&) = delete;

  // What the optimizer updates: one flat (shard_size) value + gradient per non-empty unit,
  // named "shard.<unit>" (unit L is the root).
  std::vector<model::Parameter*> shard_parameters();
  // For AdamW (one list per shard parameter, same order): which model parameter each element is.
  std::vector<std::vector<ElementOrigin>> element_origins() const;

  // The model's forward_backward with the gathers and reductions above; gradients accumulate into
  // the shards (grad_scale as model::Decoder::forward_backward). While sharded, call the model only
  // through this (its own entry points would find the root unit's values absent).
  model::LossResult forward_backward(const model::Batch& batch, float grad_scale);
  // The model's forward_loss (no gradients) with the same gathers; nothing gathered outlives it.
  // Every rank must call it the same number of times (the gathers are collectives).
  model::LossResult forward_loss(const model::Batch& batch);
  void zero_grad();
  // √Σ‖g‖² over every rank's shards (one allreduce), and torch's clip_grad_norm_ with it.
  double gradient_norm();
  double clip_gradient_norm(double max_norm);

  // The full values of the sharded parameters in place (for saving), and back. Every rank takes part
  // in the gathers; only a rank that keeps them (rank 0, which writes) ends up holding them — the
  // others hold one unit at a time.
  void gather_full_parameters(bool keep = true);
  void release_full_parameters();
  // Sets this rank's shards from full per-parameter tensors by name (resume); errors name the
  // missing or misshapen entry and `where`.
  void load_full_parameters(const std::map<std::string, Tensor>& by_name, const std::string& where);
  // The optimizer's moments as an unsharded AdamW names them ("exp_avg.<param>", "exp_avg_sq.<param>"),
  // gathered unit by unit (every rank takes part; empty unless keep); and the reverse, the shard
  // state AdamW::load_state wants.
  std::map<std::string, Tensor> gather_optimizer_state(const AdamW& optimizer, bool keep = true);
  // A checkpoint's moments and trained values, unit by unit: every rank takes part in each unit's
  // gathers, in the units' order (the moments' or the values', never interleaved); where a sink is
  // given it gets each parameter's full tensor (a view, valid for the call: the unit is released
  // before the next is gathered). A sink that throws stops no gather (the other ranks wait in them):
  // the first error comes back after the last. optimizer_state_specs: the moments' names, dtypes
  // and shapes (as gather_optimizer_state names them), sorted by name.
  void stream_optimizer_state(const AdamW& optimizer, const io::TensorSink& sink);
  void stream_full_parameters(const io::TensorSink& sink);
  // A LoRA checkpoint's parts: the trainable values (the adapters, small) all gathered in place, only
  // a rank that keeps them holding them (as gather_full_parameters, without the frozen base); then
  // the frozen base unit by unit, every rank gathering each unit's in the units' order, and `held`
  // (where given) called with the names of the parameters whose values it holds for the call (the
  // merged model is made of them and the adapters as they come: rank 0 holds one unit of the base at
  // a time, not the model). A `held` that throws stops no gather; the first error comes back after
  // the last. frozen_specs: the sharded frozen parameters' names, dtypes and shapes, in the units' order.
  void gather_trainable_parameters(bool keep);
  void stream_frozen_parameters(const std::function<void(const std::vector<std::string>& names)>& held);
  std::vector<io::TensorSpec> frozen_specs() const;
  std::vector<io::TensorSpec> optimizer_state_specs(const AdamW& optimizer) const;
  std::map<std::string, Tensor> shard_optimizer_state(const std::map<std::string, Tensor>& full, const std::string& where);

  ShardedMemory memory() const;
  const std::vector<FlatShardLayout>& layouts() const { return layouts_; }

 private:
  struct Unit;
  void gather(Unit& u);
  void release(Unit& u);
  void begin_gradients(Unit& u);
  void reduce_gradients(Unit& u);

  model::Decoder& model_;
  dist::ProcessGroup& group_;
  ShardingOptions options_;
  std::vector<std::unique_ptr<Unit>> units_;  // layers 0..L-1, then the root
  std::vector<FlatShardLayout> layouts_;      // per unit
  int64_t replicated_frozen_bytes_ = 0;
};

}  // namespace ktune::train
