// cuda::Decoder's sharding: ZeRO-3's weight units (each layer's sharded parameters, this rank's piece,
// the two slots a layer is gathered into, prefetched a layer ahead) and ZeRO-2's gradient slots and
// reduce channels (each unit reduce-scattered on the hook's stream as its backward ends).
#include "model/cuda/decoder_impl.h"

namespace ktune::cuda {

using namespace decoder_internal;

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
// scales (numel / 64 bf16). Each unit padded to optimizer_shards * 64 elements.
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

}  // namespace ktune::cuda
