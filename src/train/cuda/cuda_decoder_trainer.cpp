// The GPU step behind the recipes (cuda_trainer.h): CudaTrainer over a cuda::Decoder, built as the
// plugin libktune_cuda_step.so (src/train/cuda/CMakeLists.txt) that make_cuda_trainer() loads. It
// uses only plain structs of the host side (model::Parameter, Tensor, the plan) and its own copies
// of src/core and of the NCCL process group (with the rendezvous store's client, which it calls on
// the binary's store), so that the plugin needs nothing else of the binary.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/random_bits.h"
#include "dist/cuda/process_group_nccl.h"
#include "dist/cuda/stream_collectives.h"
#include "dist/tcp_store.h"
#include "kernels/cuda/adamw.h"
#include "kernels/cuda/device_memory.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/decoder.h"
#include "train/cuda_trainer.h"

namespace ktune::train {

namespace {

// A host tensor (a recipe state's trainable values: f32 or bf16) onto the GPU parameter `name`: a
// bf16 one as it is, an f32 one read a chunk at a time.
void upload_tensor(cuda::Decoder& device, const std::string& name, const Tensor& value) {
  if (value.dtype() == DType::BF16) return device.upload_bf16(name, value.bf16(), value.numel());
  check(value.dtype() == DType::F32, "device=cuda: parameter " + name,
        std::string("uploads f32 or bf16 values, not ") + dtype_name(value.dtype()));
  device.upload_read(name, cuda::Decoder::reader_of(value.f32()));
}

// A host parameter onto the GPU: a value the host holds in bf16 as it stores it as it is (a mapped
// bf16 checkpoint's pages go up without an f32 widening and a bf16 rounding on the host), any other
// through `read` a chunk at a time (an f32 file read as bf16, an f16 one, f32 adapters, QLoRA's bases
// to quantise): never a converted copy of the whole value on the host (up to 8 bytes a value of the
// largest parameter, the embedding: 4 GB at 8B, 9 GB for Gemma 2 27B, on every rank).
void upload_parameter(cuda::Decoder& device, const model::Parameter& p, const HostReader& read) {
  // Not model::value_in_other_dtype: this plugin links none of the CPU engine's libraries.
  const bool held_as_stored = !p.stored_dtype || *p.stored_dtype == p.value.dtype();
  if (p.value.defined() && p.value.dtype() == DType::BF16 && held_as_stored)
    return device.upload_bf16(p.name, p.value.bf16(), p.value.numel());
  device.upload_read(p.name, [&p, &read](int64_t first, int64_t count, float* out) { read(p, first, count, out); });
}

// Data parallelism over gpus_ (cuda_trainer.h): replicated (optimizer_shards 1: the gradients
// all-reduced, every GPU steps everything) or sharded (optimizer_shards = the group's size: the
// gradients reduce-scattered into each GPU's slice of the buffer, each GPU steps its slice, the
// updated values all-gathered). With the gradients sharded too (TrainingSetup::shard_gradients,
// ZeRO-2: a full fine-tune) each gradient unit is reduce-scattered as soon as the decoder's backward
// has finished it (gradient_reduce), while the next layer's backward runs into the decoder's other
// gradient slot, and the decoder adds this GPU's piece into its accumulator on its default stream
// once the reduce-scatter is done; the values and the moments are gathered unit by unit through the
// units' buffers. With the layers' weights sharded too
// (TrainingSetup::shard_weights, ZeRO-3) each GPU updates its pieces of them in place and the decoder
// gathers a layer's weights into one of its two weight slots through the weight gather hook
// (weight_gather) before the layer's forward and backward, the next layer's while this one computes;
// only the embedding's and the top unit's values are gathered after a step, and a checkpoint's
// download gathers the layers unit by unit (a LoRA run's sharded weights are its frozen base: the
// same gathers, nothing to update or download). The group's collectives run on a stream of their
// own. The weight gathers and the gradient reduce-scatters are stream-ordered where the group has
// that side (NCCL's, dist/cuda/stream_collectives.h): enqueued behind the decoder's event, waited for
// by the decoder's stream through another, never by the host (a Gloo group's fall back to blocking
// ones). Every other collective is blocking, so the device is synchronised before each (what they
// read was written on the default stream) and each returns when its own stream is done; that
// synchronisation first polls the enqueued collectives (synchronize()), so that a dead peer ends in
// the group's Error, not in a cudaDeviceSynchronize that never returns; so does the decoder before
// each host synchronisation of its step.
class CudaDecoderTrainer final : public CudaTrainer {
 public:
  CudaDecoderTrainer(const std::vector<model::Parameter*>& host, const CudaStepPlan& plan, uint64_t seed,
                     const HostReader& read, dist::ProcessGroup* gpus)
      : device_(plan.model, plan.setup, seed),
        seed_(seed),
        gpus_(gpus && gpus->size() > 1 ? gpus : nullptr),
        collectives_(dist::stream_collectives(gpus_)) {
    const cuda::TrainingSetup& setup = plan.setup;
    check(setup.optimizer_shards == 1 || (gpus_ && gpus_->size() == setup.optimizer_shards &&
                                          gpus_->rank() == setup.optimizer_shard),
          "device=cuda", "the AdamW state is planned as shard " + std::to_string(setup.optimizer_shard) + " of " +
                             std::to_string(setup.optimizer_shards) + " but the GPUs' group is " +
                             (gpus_ ? "rank " + std::to_string(gpus_->rank()) + " of " + std::to_string(gpus_->size())
                                    : std::string("absent (one GPU)")));
    for (model::Parameter* p : host) host_[p->name] = p;
    // The two models must hold the same parameters: a name on one side only is a feature the plan
    // let through by mistake, and training would silently differ.
    for (const cuda::DeviceParameter& d : device_.parameters()) {
      auto it = host_.find(d.name);
      if (it == host_.end()) throw Error("device=cuda: parameter " + d.name, "the GPU step has it; the host model does not");
      if (it->second->trainable != (d.grad != nullptr))
        throw Error("device=cuda: parameter " + d.name, "is trainable on one side only");
      const Tensor& value = it->second->value;  // undefined where the host holds it otherwise (the reader's)
      check(!value.defined() || value.numel() == d.numel, "device=cuda: parameter " + d.name,
            "has " + std::to_string(value.numel()) + " values on the host and " + std::to_string(d.numel) + " on the GPU");
      upload_parameter(device_, *it->second, read);
    }
    if (host_.size() != device_.parameters().size()) {  // every device name was found on the host: the rest
      std::set<std::string> on_device;
      for (const cuda::DeviceParameter& d : device_.parameters()) on_device.insert(d.name);
      for (const auto& [name, p] : host_)
        if (!on_device.count(name)) throw Error("device=cuda: parameter " + name, "the host model has it; the GPU step does not");
    }
    norm_scratch_ = cuda::DeviceBuffer(size_t(cuda::sum_of_squares_scratch_doubles()) * sizeof(double));
    if (setup.shard_gradients) device_.set_gradient_reduce(gradient_reduce());
    if (setup.shard_weights) device_.set_weight_gather(weight_gather());
    device_.zero_grad();  // the whole gradient buffer, gaps included, before anything sums it
  }

  void upload_trainable(const std::map<std::string, Tensor>& values, const std::string& where) override {
    for (const cuda::DeviceParameter& d : device_.parameters()) {
      if (!d.grad) continue;
      auto it = values.find(d.name);
      if (it == values.end()) throw Error(where, "recipe state has no weights for " + d.name);
      check(it->second.numel() == d.numel, where,
            "recipe state has " + std::to_string(it->second.numel()) + " values for " + d.name + ", the GPU parameter " +
                std::to_string(d.numel));
      upload_tensor(device_, d.name, it->second);
    }
  }

  // Unit by unit: a layer whose weights are sharded (a full fine-tune's, ZeRO-3) gathered into the
  // slot first (every GPU takes part), then its parameters downloaded for the sink. LoRA's sharded
  // weights are frozen: nothing to gather.
  void stream_trainable(const io::TensorSink& sink) override {
    std::exception_ptr failed;
    const std::vector<cuda::Decoder::GradientUnit>& units = device_.gradient_units();
    for (size_t u = 0; u < units.size(); ++u) {
      int64_t gathered = -1;
      for (const cuda::DeviceParameter& d : device_.parameters()) {
        if (!d.grad || d.unit != int64_t(u)) continue;
        if (device_.weights_sharded(d) && d.weight_layer != gathered) device_.gather_weights(gathered = d.weight_layer);
        if (!sink || failed) continue;
        try {
          std::vector<float> values = device_.download_value(d.name);
          sink(d.name, Tensor::view(values.data(), Shape(d.shape), DType::F32));
        } catch (...) {
          failed = std::current_exception();  // the remaining gathers still run: every GPU waits in them
        }
      }
    }
    if (failed) std::rethrow_exception(failed);
  }

  void download_trainable() override {
    stream_trainable([this](const std::string& name, const Tensor& values) {
      model::Parameter& p = *host_.at(name);
      p.value.copy_from(values.reshape(p.value.shape()));
    });
  }

  void zero_grad() override { device_.zero_grad(); }

  model::LossResult forward_backward(const FixedShapeBatch& batch, float grad_scale) override {
    check_shape(batch);
    const cuda::StepResult r = device_.forward_backward(batch.tokens.data(), batch.labels.data(), grad_scale,
                                                        batch.seq_len, positions(batch), doc_ids(batch), batch.batch_size);
    return {r.loss_sum, r.n_valid};
  }

  model::LossResult forward_loss(const FixedShapeBatch& batch) override {
    check_shape(batch);
    const cuda::StepResult r = device_.forward_loss(batch.tokens.data(), batch.labels.data(), batch.seq_len,
                                                    positions(batch), doc_ids(batch), batch.batch_size);
    return {r.loss_sum, r.n_valid};
  }

  void set_dropout_key(uint64_t key) override { device_.set_dropout_key(key); }

  // Every gradient lies in one buffer (its gaps and padding zero): one collective over the GPUs.
  // With the gradients sharded the backward has reduced each unit already (gradient_reduce).
  void reduce_gradients() override {
    if (!gpus_ || device_.setup().shard_gradients) return;
    int64_t n = 0;
    float* grads = device_.gradient_buffer(&n);
    synchronize();
    if (sharded()) {  // in place: this GPU's sums land in its own slice of the buffer
      const cuda::Decoder::OptimizerShard& shard = device_.optimizer_shard();
      gpus_->reduce_scatter_sum(grads + shard.begin, grads, shard.size);
    } else {
      gpus_->allreduce_sum(grads, n);
    }
  }

  // Σ g² over the gradients this GPU steps in one reduction (fixed order: the same on every run),
  // summed over the GPUs when sharded, and the clip as one scaling of them.
  double clip_gradient_norm(double max_norm) override {
    int64_t n = device_.optimizer_shard().size;
    float* grads = device_.optimizer_shard().grad;  // unsharded: the whole buffer
    cuda::sum_of_squares(norm_scratch_.as<double>(), grads, n);
    synchronize();  // the download below is a host synchronisation: the collectives polled first
    if (sharded()) gpus_->allreduce_sum(norm_scratch_.as<double>(), 1);
    double total = 0;
    norm_scratch_.download(&total, sizeof(double));
    const double norm = std::sqrt(total);
    if (std::isfinite(max_norm) && norm > max_norm) cuda::scale_inplace(grads, n, float(max_norm / (norm + 1e-6)));
    return norm;
  }

  void optimizer_step(double lr, const AdamWSettings& settings) override {
    ++steps_;
    cpu::AdamWStep s{float(lr), float(settings.beta1), float(settings.beta2), float(settings.eps),
                     float(settings.weight_decay), steps_};
    device_.adamw_step(s, splitmix64(seed_ ^ splitmix64(uint64_t(steps_))));  // a seed per step
    if (sharded()) gather_values();
  }

  int64_t optimizer_steps() const override { return steps_; }

  // The moments, unit by unit (exp_avg's units, then exp_avg_sq's): each unit's moment is the shard
  // itself (unsharded, one unit) or all GPUs' pieces of it gathered in its buffer, gather g being
  // moment g / units, unit g % units; a planned tensor's produce() runs the gathers up to its own.
  std::vector<io::PlannedTensor> stream_optimizer_state(bool keep) override {
    const int64_t units = int64_t(device_.gradient_units().size());
    moment_gathers_ = 2 * units;
    moment_gathers_done_ = 0;
    std::vector<io::PlannedTensor> planned;
    if (!keep) {
      if (sharded()) gather_moments_through(moment_gathers_);  // this GPU's part in rank 0's gathers
      moment_gathers_done_ = moment_gathers_;
      return planned;
    }
    const std::vector<cuda::DeviceParameter>& params = device_.parameters();
    for (int64_t g = 0; g < moment_gathers_; ++g)
      for (size_t i = 0; i < params.size(); ++i) {
        if (!params[i].grad || params[i].unit != g % units) continue;
        planned.push_back({(g < units ? "exp_avg." : "exp_avg_sq.") + params[i].name, DType::BF16,
                           Shape(params[i].shape), [this, g, i] { return moment_to_host(g, i); }});
      }
    return planned;
  }

  void finish_optimizer_state() override {
    if (sharded()) gather_moments_through(moment_gathers_);
    moment_gathers_done_ = moment_gathers_;
  }

  // Each GPU takes the elements [shard_begin, shard_end) of each parameter's moments (all of them unsharded).
  void load_optimizer_state(const std::map<std::string, Tensor>& state, int64_t steps,
                            const std::string& where) override {
    for (cuda::DeviceParameter& d : device_.parameters()) {
      if (!d.grad) continue;
      for (const auto& [prefix, moment] : {std::pair{std::string("exp_avg."), d.m}, std::pair{std::string("exp_avg_sq."), d.v}}) {
        auto it = state.find(prefix + d.name);
        if (it == state.end()) throw Error(where, "optimizer state has no " + prefix + d.name);
        check(it->second.numel() == d.numel, where, "optimizer state " + prefix + d.name + " has " +
                                                        std::to_string(it->second.numel()) + " values, the GPU parameter " +
                                                        std::to_string(d.numel));
        if (!moment) continue;  // none of it in this GPU's shard
        // Only this GPU's values are read (the state may be a view of the recipe state's mapping)
        // and, saved in f32, narrowed to bf16.
        const Tensor mine = it->second.reshape(Shape{d.numel}).slice_rows(d.shard_begin, d.shard_end);
        const Tensor narrow = mine.dtype() == DType::BF16 ? mine : mine.to(DType::BF16);
        cuda::copy_to_device(moment, narrow.bf16(), size_t(narrow.numel()) * sizeof(bf16_t));
      }
    }
    steps_ = steps;
  }

  std::string memory_report() const override { return device_.memory_report(); }
  std::string attention_report() const override { return attention_report_; }
  void set_attention_report(std::string report) { attention_report_ = std::move(report); }

 private:
  // (B, T): 0 < B, T <= the planned ones (the step runs on (B, T)).
  void check_shape(const FixedShapeBatch& batch) const {
    const cuda::TrainingSetup& plan = device_.setup();
    check(batch.batch_size > 0 && batch.batch_size <= plan.batch && batch.seq_len > 0 && batch.seq_len <= plan.seq_len &&
              int64_t(batch.tokens.size()) == batch.batch_size * batch.seq_len &&
              batch.labels.size() == batch.tokens.size() &&
              (!batch.packed() || (batch.doc_ids.size() == batch.tokens.size() &&
                                   batch.positions.size() == batch.tokens.size())),
          "device=cuda",
          "a batch of (" + std::to_string(batch.batch_size) + ", " + std::to_string(batch.seq_len) +
              ") for a step planned for (at most " + std::to_string(plan.batch) + ", at most " +
              std::to_string(plan.seq_len) + ")" + (batch.packed() ? " (packed: positions and doc ids of that shape)" : ""));
  }
  // A packed batch's positions and doc ids, nullptr for an unpacked one (0..T-1, causal only).
  static const int32_t* positions(const FixedShapeBatch& batch) {
    return batch.packed() ? batch.positions.data() : nullptr;
  }
  static const int32_t* doc_ids(const FixedShapeBatch& batch) { return batch.packed() ? batch.doc_ids.data() : nullptr; }

  bool sharded() const { return device_.setup().optimizer_shards > 1; }

  // The device synchronised, once every collective enqueued on the group's stream (ZeRO-3's weight
  // gathers, ZeRO-2's reduce-scatters) has completed: the group polls those with its timeout first,
  // so that a dead peer ends in its Error here and cudaDeviceSynchronize never waits on a collective
  // that cannot finish.
  void synchronize() {
    if (collectives_) collectives_->wait_enqueued();
    cuda::synchronize();
  }

  // ZeRO-3's weight gathers for the decoder (Decoder::WeightGather). With the group's stream-ordered
  // side (NCCL): the in-place all-gather enqueued on the group's stream behind the decoder's `ready`
  // (recorded on the default stream), `done` recorded behind it there for the default stream to wait
  // for; nothing waits on the host until wait_all, the group's poll. Otherwise (a group of the
  // blocking interface only): synchronised and gathered before returning, `done` left unrecorded (a
  // wait for an unrecorded event is no wait: the slot is whole already).
  cuda::Decoder::WeightGather weight_gather() {
    if (collectives_)
      return {[this](int64_t layer, bf16_t* slot, CUevent_st* ready, CUevent_st* done) {
                const int64_t piece = device_.weight_units()[size_t(layer)].piece;
                collectives_->enqueue_all_gather_bytes_in_place(slot, piece * int64_t(sizeof(bf16_t)), ready, done);
              },
              [this] { collectives_->wait_enqueued(); }};
    return {[this](int64_t layer, bf16_t* slot, CUevent_st*, CUevent_st*) {
              gather_in_place(slot, device_.weight_units()[size_t(layer)].piece);
            },
            [] {}};
  }

  // A unit's gradient buffer as bf16 laid out like its gradients (unit element e at staging[e -
  // begin]): the scratch of the gathers below, which overwrite the gradients (spent once AdamW has
  // read them; the recipe zeroes the buffer before each step, and with shard_gradients the backward
  // zeroes each unit before writing it). It holds the unit's size bf16 in half its bytes; the layer
  // units share two slots, so each unit is gathered and copied out before the next.
  static bf16_t* staging(const cuda::Decoder::GradientUnit& unit) { return reinterpret_cast<bf16_t*>(unit.grads); }

  // ZeRO-2's reduce-scatters for the decoder (Decoder::GradientReduce), as weight_gather's: with the
  // group's stream-ordered side, a unit's in-place reduce-scatter enqueued on the group's stream
  // behind the decoder's `ready`, `done` recorded behind it (the decoder's default stream waits for it
  // and adds this GPU's piece into its accumulator); otherwise synchronised and reduced before
  // returning, `done` left unrecorded.
  cuda::Decoder::GradientReduce gradient_reduce() {
    if (collectives_)
      return {[this](int64_t u, CUevent_st* ready, CUevent_st* done) {
                const cuda::Decoder::GradientUnit& unit = device_.gradient_units()[size_t(u)];
                collectives_->enqueue_reduce_scatter_sum_in_place(unit.grads, unit.piece, ready, done);
              },
              [this] { collectives_->wait_enqueued(); }};
    return {[this](int64_t u, CUevent_st*, CUevent_st*) {
              const cuda::Decoder::GradientUnit& unit = device_.gradient_units()[size_t(u)];
              synchronize();
              gpus_->reduce_scatter_sum(unit.grads + gpus_->rank() * unit.piece, unit.grads, unit.piece);
            },
            [] {}};
  }

  // All GPUs' pieces of a unit of bf16 values laid out like its gradients: this GPU's `own`
  // (unit.piece) goes into its piece of the staging, and the group gathers the pieces in place.
  // Returns the staging.
  const bf16_t* gather_pieces(const cuda::Decoder::GradientUnit& unit, const bf16_t* own) {
    bf16_t* all = staging(unit);
    cuda::copy_on_device(all + gpus_->rank() * unit.piece, own, size_t(unit.piece) * sizeof(bf16_t));
    gather_in_place(all, unit.piece);
    return all;
  }

  // Every GPU's piece of a unit's bf16 values (`all`: the unit's size, this GPU's piece at its place)
  // to every GPU, in place, once the device's earlier work (which may still read `all`) is done: the
  // staging's gathers, and without the group's stream-ordered side the decoder's weight gathers.
  void gather_in_place(bf16_t* all, int64_t piece) {
    synchronize();
    gpus_->all_gather_bytes(all, all + gpus_->rank() * piece, piece * int64_t(sizeof(bf16_t)));
  }

  // After a sharded AdamW step, unit by unit: each GPU's updated values (its piece's elements of each
  // parameter) into its piece of the staging, gathered, and every parameter's values copied out. Not
  // a full fine-tune's layer units, whose weights are sharded (ZeRO-3): each GPU keeps its updated piece only.
  void gather_values() {
    const std::vector<cuda::Decoder::GradientUnit>& units = device_.gradient_units();
    for (size_t u = 0; u < units.size(); ++u) {
      bool any_whole = false;
      for (const cuda::DeviceParameter& d : device_.parameters())
        any_whole = any_whole || (d.grad && d.unit == int64_t(u) && !device_.weights_sharded(d));
      if (!any_whole) continue;
      bf16_t* all = staging(units[u]);
      for (const cuda::DeviceParameter& d : device_.parameters())
        if (d.m && d.unit == int64_t(u))
          cuda::copy_on_device(all + (d.grad_offset - units[u].begin) + d.shard_begin, d.value + d.shard_begin,
                               size_t(d.shard_end - d.shard_begin) * sizeof(bf16_t));
      gather_in_place(all, units[u].piece);
      for (const cuda::DeviceParameter& d : device_.parameters())
        if (d.grad && d.unit == int64_t(u))
          cuda::copy_on_device(d.value, all + (d.grad_offset - units[u].begin), size_t(d.numel) * sizeof(bf16_t));
    }
  }

  // Runs the moments' gathers [moment_gathers_done_, n) (stream_optimizer_state): the last one's unit
  // is then in gathered_moment_.
  void gather_moments_through(int64_t n) {
    const cuda::Decoder::OptimizerShard& shard = device_.optimizer_shard();
    const std::vector<cuda::Decoder::GradientUnit>& units = device_.gradient_units();
    for (; moment_gathers_done_ < n; ++moment_gathers_done_) {
      const size_t u = size_t(moment_gathers_done_ % int64_t(units.size()));
      const bf16_t* moment = moment_gathers_done_ < int64_t(units.size()) ? shard.m : shard.v;
      gathered_moment_ = sharded() ? gather_pieces(units[u], moment + units[u].shard_offset) : moment;
      synchronize();
    }
  }

  // Parameter i's values of gather g's moment, on the host (bf16, its shape). Gathers run in order and
  // each overwrites the last one's buffer: a tensor produced after a later gather ran is refused.
  Tensor moment_to_host(int64_t g, size_t i) {
    const cuda::DeviceParameter& d = device_.parameters()[i];
    check(g + 1 >= moment_gathers_done_, "optimizer state " + d.name,
          "produced after the gathers moved past it (the planned tensors are produced in order)");
    gather_moments_through(g + 1);
    const cuda::Decoder::GradientUnit& unit = device_.gradient_units()[size_t(d.unit)];
    Tensor t = Tensor::empty(Shape(d.shape), DType::BF16);
    cuda::copy_to_host(t.bf16(), gathered_moment_ + (d.grad_offset - unit.begin), size_t(d.numel) * sizeof(bf16_t));
    return t;
  }

  cuda::Decoder device_;
  uint64_t seed_;
  dist::ProcessGroup* gpus_;  // nullptr: one GPU
  dist::StreamCollectives* collectives_;  // gpus_'s stream-ordered side (NCCL's); nullptr: none, or one GPU
  std::map<std::string, model::Parameter*> host_;
  cuda::DeviceBuffer norm_scratch_;
  int64_t steps_ = 0;
  // stream_optimizer_state: the moments' gathers planned and run, and the buffer the last one filled.
  int64_t moment_gathers_ = 0, moment_gathers_done_ = 0;
  const bf16_t* gathered_moment_ = nullptr;
  std::string attention_report_;
};

// Every GPU's trials, gathered so that all of them take the same kernel: per kernel the mean time,
// the largest difference any GPU saw, and a failure anywhere (trials are in the same order on every GPU:
// they depend on the shape alone).
void gather_trials(std::vector<cuda::AttentionTrial>& trials, dist::ProcessGroup& gpus) {
  const int64_t n = int64_t(trials.size()) * 3, world = gpus.size();
  std::vector<float> mine;  // per trial: ms, error, failed (0 / 1)
  for (const cuda::AttentionTrial& t : trials)
    mine.insert(mine.end(), {float(t.ms), float(t.error), t.failure.empty() ? 0.0f : 1.0f});
  cuda::DeviceBuffer in(size_t(n) * sizeof(float)), all(size_t(n * world) * sizeof(float));
  in.upload(mine.data(), mine.size() * sizeof(float));
  gpus.all_gather(all.as<float>(), in.as<float>(), n);
  std::vector<float> every(size_t(n * world));
  all.download(every.data(), every.size() * sizeof(float));
  for (size_t i = 0; i < trials.size(); ++i) {
    cuda::AttentionTrial& t = trials[i];
    double ms = 0.0, error = 0.0;
    for (int64_t r = 0; r < world; ++r) {
      const float* theirs = every.data() + r * n + int64_t(i) * 3;
      ms += theirs[0] / double(world);
      error = std::max(error, double(theirs[1]));
      if (theirs[2] != 0.0f && t.failure.empty()) t.failure = "failed on GPU " + std::to_string(r);
    }
    t.ms = ms;
    t.error = error;
  }
}

// The plan with TrainingSetup::attention kAuto replaced by the kernel chosen on this GPU, the same
// on every GPU of `gpus` (nullptr or one: this GPU's alone); report: the line that says so.
CudaStepPlan with_attention_chosen(const CudaStepPlan& plan, dist::ProcessGroup* gpus, std::string* report) {
  CudaStepPlan chosen = plan;
  if (plan.setup.attention != cuda::TrainingSetup::Attention::kAuto) {
    *report = std::string("attention kernels: ") + cuda::attention_name(plan.setup.attention) +
              " (as set: KTUNE_CUDA_ATTENTION; not timed)";
    return chosen;
  }
  cuda::LayerTrials timed;
  try {
    timed = cuda::time_attention_kernels_for_layers(plan.model, plan.setup, plan.attention_document_tokens);
  } catch (const Error& e) {
    throw Error("device=cuda: KTUNE_CUDA_ATTENTION=auto",
                std::string(e.what()) + "; set KTUNE_CUDA_ATTENTION to gemm, tensor_core or flash to train without "
                                        "the trials (and please report this)");
  }
  const bool several = gpus != nullptr && gpus->size() > 1;
  if (several) gather_trials(timed.trials, *gpus);
  chosen.setup.attention = cuda::pick_attention(timed.trials);
  *report = cuda::describe_attention_trials(timed, chosen.setup.attention) +
            (several ? " (over " + std::to_string(gpus->size()) + " GPUs: mean times, largest differences)" : "");
  return chosen;
}

}  // namespace

}  // namespace ktune::train

// The plugin's entry points (cuda_trainer.h). Errors propagate as ktune::Error.
extern "C" __attribute__((visibility("default"))) int ktune_cuda_step_device_count() {
  return ktune::cuda::device_count();
}

extern "C" __attribute__((visibility("default"))) void ktune_cuda_step_select_device(int index) {
  ktune::cuda::set_device(index);
}

extern "C" __attribute__((visibility("default"))) ktune::dist::ProcessGroup* ktune_cuda_step_make_process_group(
    ktune::dist::TcpStore* store, const std::string* prefix, int rank, int size, int64_t timeout_ms) {
  return ktune::dist::make_nccl_process_group(*store, *prefix, rank, size, std::chrono::milliseconds(timeout_ms))
      .release();
}

extern "C" __attribute__((visibility("default"))) void ktune_cuda_step_plan_memory(
    const ktune::train::CudaStepPlan* plan, ktune::cuda::Decoder::MemoryPlan* out) {
  *out = ktune::cuda::Decoder::plan(plan->model, plan->setup);
}

extern "C" __attribute__((visibility("default"))) ktune::train::CudaTrainer* ktune_create_cuda_trainer(
    const std::vector<ktune::model::Parameter*>* host, const ktune::train::CudaStepPlan* plan, uint64_t seed,
    const ktune::train::HostReader* read, ktune::dist::ProcessGroup* gpus) {
  std::string attention;
  const ktune::train::CudaStepPlan chosen = ktune::train::with_attention_chosen(*plan, gpus, &attention);
  auto* trainer = new ktune::train::CudaDecoderTrainer(*host, chosen, seed, *read, gpus);
  trainer->set_attention_report(std::move(attention));
  return trainer;
}
