#include "train/sharded_data_parallel.h"

#include <cmath>
#include <cstring>
#include <exception>

#include "core/error.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/bf16_rounding.h"
#include "train/optimizer.h"

namespace ktune::train {

// The frozen parameters of a unit: sharded values only (no gradient, no optimizer state).
struct FrozenFlat {
  std::vector<model::Parameter*> params;
  std::vector<Shape> shapes;
  FlatShardLayout layout;
  DType dtype = DType::F32;      // of every value in it
  Tensor shard;                  // (shard_size) in dtype
  std::shared_ptr<Tensor> full;  // gathered (padded), null while sharded
};

struct ShardedDataParallel::Unit {
  int64_t index = 0;
  std::vector<model::Parameter*> params;  // trainable
  std::vector<Shape> shapes;  // of params (their values are undefined while the unit is sharded)
  FlatShardLayout layout;
  DType dtype = DType::F32;           // of the values, the gradient shard and the moments: f32 or bf16
  model::Parameter shard;             // value, grad: (shard_size) in dtype, this rank's part
  std::shared_ptr<Tensor> full;       // gathered values (padded), null while sharded
  std::shared_ptr<Tensor> full_grad;  // full gradients (padded, f32 whatever dtype) between a backward and its reduction
  FrozenFlat frozen;
  bool gathered = false;
  bool empty() const { return params.empty(); }  // nothing trainable
};

namespace {
// Copies the part of parameter i of `layout` that `rank` owns from p's value into a shard of p's
// stored dtype: a value held as stored byte for byte, one held otherwise (a checkpoint file's mapped
// value in the file's dtype, a recipe state's tensor in another dtype) read as stored, a chunk of the
// owned part at a time: never a converted copy of the whole parameter.
void copy_owned_part(const FlatShardLayout& layout, size_t i, int rank, const Tensor& shard, const model::Parameter& p) {
  auto [lo, hi] = layout.param_in_shard(i, rank);
  if (lo >= hi) return;
  const size_t elem = dtype_bytes(shard.dtype(), 1);
  char* out = static_cast<char*>(shard.raw()) + size_t(lo - layout.shard_begin(rank)) * elem;
  const int64_t first = lo - layout.offset[i];
  if (p.value.dtype() == shard.dtype() && !model::value_in_other_dtype(p)) {
    std::memcpy(out, static_cast<const char*>(p.value.raw()) + size_t(first) * elem, size_t(hi - lo) * elem);
    return;
  }
  constexpr int64_t kChunk = int64_t(1) << 16;
  std::vector<float> wide(size_t(std::min(kChunk, hi - lo)));
  for (int64_t done = 0; done < hi - lo; done += kChunk) {
    const int64_t n = std::min(kChunk, hi - lo - done);
    model::read_stored_f32(p, first + done, n, wide.data());
    if (shard.dtype() == DType::F32)
      std::memcpy(reinterpret_cast<float*>(out) + done, wide.data(), size_t(n) * sizeof(float));
    else
      cpu::round_to_bf16(reinterpret_cast<bf16_t*>(out) + done, wide.data(), n);
  }
}

// The same from a whole tensor (a recipe state's), converted to the shard's dtype.
void copy_owned_part(const FlatShardLayout& layout, size_t i, int rank, const Tensor& shard, const Tensor& full) {
  model::Parameter held;
  held.value = full;
  held.stored_dtype = shard.dtype();
  copy_owned_part(layout, i, rank, shard, held);
}

// All-gathers n_per_rank elements of dtype (f32 or bf16) from every rank, bit for bit.
void all_gather_any(dist::ProcessGroup& group, void* out, const void* in, int64_t n_per_rank, DType dtype) {
  group.all_gather_bytes(out, in, int64_t(dtype_bytes(dtype, size_t(n_per_rank))));
}

// The one dtype of a flat's parameters as the model stores them (f32 when there are none).
DType flat_dtype(const std::vector<model::Parameter*>& params, const std::string& what) {
  if (params.empty()) return DType::F32;
  const DType d = model::stored_dtype_of(*params.front());
  for (model::Parameter* p : params)
    check(model::stored_dtype_of(*p) == d, "sharded data parallel",
          what + " " + p->name + " is " + dtype_name(model::stored_dtype_of(*p)) + " but " + params.front()->name +
              " of the same layer is " + dtype_name(d) + " (a flat holds one dtype)");
  return d;
}
}  // namespace

ShardedDataParallel::ShardedDataParallel(model::Decoder& model, const std::vector<model::Parameter*>& trainable,
                                         dist::ProcessGroup& group, ShardingOptions options)
    : model_(model), group_(group), options_(options) {
  const int64_t L = model.config().num_layers;
  for (int64_t u = 0; u <= L; ++u) {
    units_.push_back(std::make_unique<Unit>());
    units_.back()->index = u;
  }
  auto unit_of = [&](const model::Parameter* p) -> Unit& {
    const int64_t layer = layer_of_parameter(p->name);
    check(layer < L, "sharded data parallel", "parameter " + p->name + " names a layer beyond the model's " + std::to_string(L));
    return *units_[size_t(layer < 0 ? L : layer)];
  };
  for (model::Parameter* p : trainable) {
    const DType stored = p->value.defined() ? model::stored_dtype_of(*p) : DType::NF4;
    check(stored == DType::F32 || stored == DType::BF16, "sharded data parallel",
          "parameter " + p->name + " must hold f32 or bf16 values to be sharded");
    Unit& u = unit_of(p);
    u.params.push_back(p);
    u.shapes.push_back(p->value.shape());
  }
  // Frozen f32 or bf16 weights (the LoRA base) are sharded too, one dtype per unit (the first
  // frozen weight's); others stay whole (QLoRA's base lives in its adapter as NF4, no value left).
  for (model::Parameter* p : model.parameters()) {
    if (p->trainable || !p->value.defined()) continue;
    Unit& u = unit_of(p);
    const DType d = model::stored_dtype_of(*p);
    const bool shardable = d == DType::F32 || d == DType::BF16;
    if (shardable && u.frozen.params.empty()) u.frozen.dtype = d;
    if (!shardable || d != u.frozen.dtype) {
      replicated_frozen_bytes_ += int64_t(p->value.bytes());
      continue;
    }
    u.frozen.params.push_back(p);
    u.frozen.shapes.push_back(p->value.shape());
  }
  const int rank = group.rank();
  // Full gradients first, then each unit's full values as soon as its shard holds them: the
  // construction never holds a full copy of the trainable state next to its shards.
  for (model::Parameter* p : trainable) p->grad = Tensor();
  for (auto& up : units_) {
    Unit& u = *up;
    std::vector<int64_t> numels;
    for (const Shape& s : u.shapes) numels.push_back(s.numel());
    u.layout = FlatShardLayout::plan(numels, group.size());
    layouts_.push_back(u.layout);
    numels.clear();
    for (const Shape& sh : u.frozen.shapes) numels.push_back(sh.numel());
    u.frozen.layout = FlatShardLayout::plan(numels, group.size());
    u.frozen.shard = Tensor::zeros({u.frozen.layout.shard_size()}, u.frozen.dtype);
    for (size_t i = 0; i < u.frozen.params.size(); ++i) {
      copy_owned_part(u.frozen.layout, i, rank, u.frozen.shard, *u.frozen.params[i]);
      u.frozen.params[i]->value = Tensor();
    }
    if (u.empty()) continue;
    u.dtype = flat_dtype(u.params, "trainable parameter");
    u.shard.name = "shard." + std::to_string(u.index);
    u.shard.value = Tensor::zeros({u.layout.shard_size()}, u.dtype);
    u.shard.grad = Tensor::zeros({u.layout.shard_size()}, u.dtype);
    u.shard.trainable = true;
    for (size_t i = 0; i < u.params.size(); ++i) {
      copy_owned_part(u.layout, i, rank, u.shard.value, *u.params[i]);
      u.params[i]->value = Tensor();
    }
  }

  model::LayerHooks hooks;
  hooks.before_forward = [this](int64_t l) { gather(*units_[size_t(l)]); };
  hooks.after_forward = [this](int64_t l) {
    if (options_.reshard_after_forward) release(*units_[size_t(l)]);
  };
  hooks.before_backward = [this](int64_t l) {
    gather(*units_[size_t(l)]);
    begin_gradients(*units_[size_t(l)]);
  };
  hooks.after_backward = [this](int64_t l) {
    reduce_gradients(*units_[size_t(l)]);
    release(*units_[size_t(l)]);
  };
  model.set_layer_hooks(std::move(hooks));
}

ShardedDataParallel::~ShardedDataParallel() { model_.set_layer_hooks({}); }

std::vector<model::Parameter*> ShardedDataParallel::shard_parameters() {
  std::vector<model::Parameter*> out;
  for (auto& u : units_)
    if (!u->empty()) out.push_back(&u->shard);
  return out;
}

std::vector<std::vector<ElementOrigin>> ShardedDataParallel::element_origins() const {
  std::vector<std::vector<ElementOrigin>> out;
  const int rank = group_.rank();
  for (auto& u : units_) {
    if (u->empty()) continue;
    std::vector<ElementOrigin> origins;
    for (size_t i = 0; i < u->params.size(); ++i) {
      auto [lo, hi] = u->layout.param_in_shard(i, rank);
      if (lo < hi)
        origins.push_back({lo - u->layout.shard_begin(rank), hi - u->layout.shard_begin(rank), u->params[i]->name,
                           lo - u->layout.offset[i]});
    }
    out.push_back(std::move(origins));
  }
  return out;
}

namespace {
// All-gathers a flat of `layout` from this rank's shard and points the parameters' values into it.
std::shared_ptr<Tensor> gather_flat(dist::ProcessGroup& group, const FlatShardLayout& layout, const Tensor& shard,
                                    const std::vector<model::Parameter*>& params, const std::vector<Shape>& shapes) {
  const DType dtype = shard.dtype();
  auto full = std::make_shared<Tensor>(Tensor::empty({layout.padded}, dtype));
  all_gather_any(group, full->raw(), shard.raw(), layout.shard_size(), dtype);
  const size_t elem = dtype_bytes(dtype, 1);
  for (size_t i = 0; i < params.size(); ++i)
    params[i]->value = Tensor::view(static_cast<char*>(full->raw()) + size_t(layout.offset[i]) * elem, shapes[i], dtype, full);
  return full;
}
}  // namespace

void ShardedDataParallel::gather(Unit& u) {
  if (u.gathered) return;
  if (!u.params.empty()) u.full = gather_flat(group_, u.layout, u.shard.value, u.params, u.shapes);
  if (!u.frozen.params.empty())
    u.frozen.full = gather_flat(group_, u.frozen.layout, u.frozen.shard, u.frozen.params, u.frozen.shapes);
  u.gathered = true;
}

void ShardedDataParallel::release(Unit& u) {  // also what a partial gather holds (gather_trainable_parameters)
  for (model::Parameter* p : u.params) p->value = Tensor();
  for (model::Parameter* p : u.frozen.params) p->value = Tensor();
  u.full.reset();
  u.frozen.full.reset();
  u.gathered = false;
}

void ShardedDataParallel::begin_gradients(Unit& u) {
  if (u.empty() || u.full_grad) return;
  u.full_grad = std::make_shared<Tensor>(Tensor::zeros({u.layout.padded}));
  for (size_t i = 0; i < u.params.size(); ++i)
    u.params[i]->grad = Tensor::view(u.full_grad->f32() + u.layout.offset[i], u.shapes[i], DType::F32, u.full_grad);
}

void ShardedDataParallel::reduce_gradients(Unit& u) {
  if (!u.full_grad) return;
  const int64_t S = u.layout.shard_size();
  float* flat = u.full_grad->f32();
  group_.reduce_scatter_sum(flat, flat, S);  // flat[0:S] ← Σ_ranks this rank's part, in f32
  model::add_to_gradient(u.shard.grad, 0, flat, S);  // bf16 shards: rounded once per micro-batch
  for (model::Parameter* p : u.params) p->grad = Tensor();
  u.full_grad.reset();
}

model::LossResult ShardedDataParallel::forward_backward(const model::Batch& batch, float grad_scale) {
  Unit& root = *units_.back();
  gather(root);
  begin_gradients(root);
  model::LossResult r = model_.forward_backward(batch, grad_scale);
  reduce_gradients(root);
  release(root);
  // Layers the backward did not reach hold nothing trainable (empty units): this only makes
  // sure no gathered value outlives the step.
  for (auto& u : units_) {
    reduce_gradients(*u);
    release(*u);
  }
  return r;
}

model::LossResult ShardedDataParallel::forward_loss(const model::Batch& batch) {
  gather(*units_.back());  // the root: embeddings, final norm, head
  model::LossResult r = model_.forward_loss(batch);
  for (auto& u : units_) release(*u);
  return r;
}

void ShardedDataParallel::zero_grad() {
  for (auto& u : units_)
    if (!u->empty()) u->shard.grad.fill_zero();
}

double ShardedDataParallel::gradient_norm() {
  double sum = 0;
  for (auto& u : units_)
    if (!u->empty()) sum += gradient_sum_of_squares(u->shard.grad);
  group_.allreduce_sum(&sum, 1);
  return std::sqrt(sum);
}

double ShardedDataParallel::clip_gradient_norm(double max_norm) {
  const double norm = gradient_norm();
  if (std::isfinite(max_norm) && norm > max_norm) scale_gradients(shard_parameters(), float(max_norm / (norm + 1e-6)));
  return norm;
}

void ShardedDataParallel::gather_full_parameters(bool keep) {
  for (auto& u : units_) {
    gather(*u);
    if (!keep) release(*u);
  }
}

void ShardedDataParallel::release_full_parameters() {
  for (auto& u : units_) release(*u);
}

void ShardedDataParallel::gather_trainable_parameters(bool keep) {
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.gathered || u.params.empty()) continue;
    std::shared_ptr<Tensor> full = gather_flat(group_, u.layout, u.shard.value, u.params, u.shapes);
    if (keep) {
      u.full = std::move(full);  // the values are views of it; release() drops them
    } else {
      for (model::Parameter* p : u.params) p->value = Tensor();
    }
  }
}

void ShardedDataParallel::stream_frozen_parameters(const std::function<void(const std::vector<std::string>&)>& held) {
  std::exception_ptr failed;
  for (auto& up : units_) {
    FrozenFlat& f = up->frozen;
    if (f.params.empty()) continue;
    const bool was_held = f.full != nullptr;
    if (!was_held) f.full = gather_flat(group_, f.layout, f.shard, f.params, f.shapes);
    if (held && !failed) try {
        std::vector<std::string> names;
        for (const model::Parameter* p : f.params) names.push_back(p->name);
        held(names);
      } catch (...) {
        failed = std::current_exception();  // the remaining gathers still run: every rank waits in them
      }
    if (was_held) continue;
    for (model::Parameter* p : f.params) p->value = Tensor();
    f.full.reset();
  }
  if (failed) std::rethrow_exception(failed);
}

std::vector<io::TensorSpec> ShardedDataParallel::frozen_specs() const {
  std::vector<io::TensorSpec> specs;
  for (const auto& up : units_)
    for (size_t i = 0; i < up->frozen.params.size(); ++i)
      specs.push_back({up->frozen.params[i]->name, up->frozen.dtype, up->frozen.shapes[i]});
  return specs;
}

void ShardedDataParallel::load_full_parameters(const std::map<std::string, Tensor>& by_name, const std::string& where) {
  const int rank = group_.rank();
  for (auto& up : units_) {
    Unit& u = *up;
    release(u);
    for (size_t i = 0; i < u.params.size(); ++i) {
      auto it = by_name.find(u.params[i]->name);
      if (it == by_name.end()) throw Error(where, "has no weights for " + u.params[i]->name);
      if (it->second.shape() != u.shapes[i])
        throw Error(where, u.params[i]->name + " has shape " + it->second.shape().str() + ", expected " + u.shapes[i].str());
      copy_owned_part(u.layout, i, rank, u.shard.value, it->second);
    }
  }
}

std::map<std::string, Tensor> ShardedDataParallel::gather_optimizer_state(const AdamW& optimizer, bool keep) {
  std::map<std::string, Tensor> out;
  stream_optimizer_state(optimizer, keep ? io::TensorSink([&](const std::string& name, const Tensor& t) {
    out[name] = t.clone();
  })
                                         : io::TensorSink());
  return out;
}

void ShardedDataParallel::stream_optimizer_state(const AdamW& optimizer, const io::TensorSink& sink) {
  const std::map<std::string, Tensor> state = optimizer.state();
  std::exception_ptr failed;
  for (auto& up : units_) {
    const Unit& u = *up;
    if (u.empty()) continue;
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
      auto it = state.find(prefix + u.shard.name);
      check(it != state.end(), "sharded data parallel", std::string("the optimizer has no ") + prefix + u.shard.name);
      const DType dtype = it->second.dtype();  // the moments are in the shard's dtype
      const size_t elem = dtype_bytes(dtype, 1);
      auto flat = std::make_shared<Tensor>(Tensor::empty({u.layout.padded}, dtype));  // one unit at a time
      all_gather_any(group_, flat->raw(), it->second.raw(), u.layout.shard_size(), dtype);
      if (!sink || failed) continue;
      try {
        for (size_t i = 0; i < u.params.size(); ++i)
          sink(prefix + u.params[i]->name,
               Tensor::view(static_cast<char*>(flat->raw()) + size_t(u.layout.offset[i]) * elem, u.shapes[i], dtype, flat));
      } catch (...) {
        failed = std::current_exception();  // the remaining gathers still run: every rank waits in them
      }
    }
  }
  if (failed) std::rethrow_exception(failed);
}

void ShardedDataParallel::stream_full_parameters(const io::TensorSink& sink) {
  std::exception_ptr failed;
  for (auto& up : units_) {
    Unit& u = *up;
    const bool held = u.gathered;
    gather(u);
    if (sink && !failed) try {
        for (model::Parameter* p : u.params) sink(p->name, p->value);
      } catch (...) {
        failed = std::current_exception();  // the remaining gathers still run: every rank waits in them
      }
    if (!held) release(u);
  }
  if (failed) std::rethrow_exception(failed);
}

std::vector<io::TensorSpec> ShardedDataParallel::optimizer_state_specs(const AdamW& optimizer) const {
  const std::map<std::string, Tensor> state = optimizer.state();
  std::map<std::string, io::TensorSpec> by_name;
  for (const auto& up : units_)
    for (size_t i = 0; i < up->params.size(); ++i)
      for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
        auto it = state.find(prefix + up->shard.name);
        check(it != state.end(), "sharded data parallel", std::string("the optimizer has no ") + prefix + up->shard.name);
        const std::string name = prefix + up->params[i]->name;
        by_name[name] = {name, it->second.dtype(), up->shapes[i]};  // the moments' dtype, the shard's
      }
  std::vector<io::TensorSpec> specs;
  for (auto& [name, spec] : by_name) specs.push_back(spec);
  return specs;
}

std::map<std::string, Tensor> ShardedDataParallel::shard_optimizer_state(const std::map<std::string, Tensor>& full,
                                                                         const std::string& where) {
  const int rank = group_.rank();
  std::map<std::string, Tensor> out;
  for (auto& up : units_) {
    Unit& u = *up;
    if (u.empty()) continue;
    for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
      Tensor shard = Tensor::zeros({u.layout.shard_size()}, u.dtype);
      for (size_t i = 0; i < u.params.size(); ++i) {
        auto it = full.find(prefix + u.params[i]->name);
        if (it == full.end()) throw Error(where, std::string("optimizer state has no ") + prefix + u.params[i]->name);
        if (it->second.shape() != u.shapes[i])
          throw Error(where, "optimizer state " + it->first + " has shape " + it->second.shape().str() + ", expected " +
                                 u.shapes[i].str());
        copy_owned_part(u.layout, i, rank, shard, it->second);
      }
      out[prefix + u.shard.name] = shard;
    }
  }
  return out;
}

ShardedMemory ShardedDataParallel::memory() const {
  ShardedMemory m;
  m.replicated_frozen = replicated_frozen_bytes_;
  for (const auto& u : units_) {
    const int64_t elem = int64_t(dtype_bytes(u->dtype, 1)), frozen_elem = int64_t(dtype_bytes(u->frozen.dtype, 1));
    const int64_t shard_bytes = u->layout.shard_size() * elem;
    m.sharded_params += shard_bytes;
    m.gradient_shards += shard_bytes;
    m.sharded_frozen += u->frozen.layout.shard_size() * frozen_elem;
    const int64_t full_bytes = u->layout.padded * elem + u->frozen.layout.padded * frozen_elem;
    if (u.get() == units_.back().get())
      m.root_unit_full = full_bytes;
    else
      m.largest_unit_full = std::max(m.largest_unit_full, full_bytes);
  }
  return m;
}

}  // namespace ktune::train
