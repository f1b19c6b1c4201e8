#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "core/random_bits.h"
#include "kernels/cpu/adamw.h"

namespace ktune::train {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull, kMul1 = 0xbf58476d1ce4e5b9ull, kMul2 = 0x94d049bb133111ebull;
constexpr int64_t kBlock = int64_t(1) << 18;  // elements widened at a time (1 MiB of f32 scratch)

// The inverse of an odd number modulo 2^64 (Newton: each round doubles the correct low bits).
constexpr uint64_t inverse_mod_2_64(uint64_t a) {
  uint64_t x = a;  // correct to 3 bits
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}
static_assert(inverse_mod_2_64(kMul1) * kMul1 == 1 && inverse_mod_2_64(kMul2) * kMul2 == 1);

// Undoes y = x ^ (x >> s).
uint64_t unshift_xor(uint64_t y, int s) {
  uint64_t x = y;
  for (int i = 0; i < 64 / s + 1; ++i) x = y ^ (x >> s);
  return x;
}

cpu::AdamWStep step_of(float lr, const AdamWSettings& settings, int64_t step) {
  cpu::AdamWStep s;
  s.lr = lr;
  s.beta1 = float(settings.beta1);
  s.beta2 = float(settings.beta2);
  s.eps = float(settings.eps);
  s.weight_decay = float(settings.weight_decay);
  s.step = step;
  return s;
}

}  // namespace

uint64_t mix64(uint64_t z) { return splitmix64(z); }  // kGolden, kMul1, kMul2 are its constants (unmix64)

uint64_t unmix64(uint64_t z) {
  z = unshift_xor(z, 31);
  z *= inverse_mod_2_64(kMul2);
  z = unshift_xor(z, 27);
  z *= inverse_mod_2_64(kMul1);
  z = unshift_xor(z, 30);
  return z - kGolden;
}

uint64_t bf16_rounding_seed(int64_t step, const std::string& name) {
  return mix64(fnv1a64(name) ^ mix64(uint64_t(step) * kGolden + 0x6b74756e65ull));
}

void adamw_step_bf16_slice(const AdamWBf16Slice& slice, float lr, const AdamWSettings& settings, int64_t step,
                           uint64_t seed) {
  // The kernel draws bits = mix64(mix64(seed) ^ i) for its i-th element. For a block [b, b + 2^k)
  // with b a multiple of 2^k, b + i == b ^ i, so calling it with seed' = unmix64(mix64(seed) ^ b)
  // gives element b + i exactly the bits a whole-tensor call gives it.
  const cpu::AdamWStep s = step_of(lr, settings, step);
  const uint64_t key = mix64(seed);
  std::vector<float> grad(size_t(std::min(slice.n, kBlock)));
  for (int64_t done = 0; done < slice.n;) {
    const uint64_t b = uint64_t(slice.first + done);
    uint64_t size = b == 0 ? uint64_t(kBlock) : (b & (~b + 1));  // the largest power of two dividing b
    size = std::min<uint64_t>(size, uint64_t(kBlock));
    while (size > uint64_t(slice.n - done)) size >>= 1;
    const int64_t n = int64_t(size);
    const bf16_t* g = slice.grad + done;
    parallel_for(n, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) grad[size_t(i)] = bf16_to_f32(g[i]);
    }, 1 << 15);
    cpu::adamw_step_bf16(slice.param + done, grad.data(), slice.m + done, slice.v + done, n, s, unmix64(key ^ b));
    done += n;
  }
}

AdamW::AdamW(std::vector<model::Parameter*> params, AdamWSettings settings, std::vector<std::vector<ElementOrigin>> origins)
    : params_(std::move(params)), settings_(settings), origins_(std::move(origins)) {
  check(origins_.empty() || origins_.size() == params_.size(), "optimizer",
        "element origins for " + std::to_string(origins_.size()) + " of " + std::to_string(params_.size()) + " parameters");
  for (model::Parameter* p : params_) {
    check(p->value.defined() && p->grad.defined(), "optimizer", "parameter " + p->name + " has no gradient");
    const DType dtype = p->value.dtype();
    check(dtype == DType::F32 || dtype == DType::BF16, "optimizer",
          "parameter " + p->name + " is " + dtype_name(dtype) + "; AdamW updates f32 or bf16 parameters");
    check(p->grad.dtype() == dtype, "optimizer",
          "parameter " + p->name + " is " + dtype_name(dtype) + " but its gradient " + dtype_name(p->grad.dtype()));
    exp_avg_.push_back(Tensor::zeros(p->value.shape(), dtype));
    exp_avg_sq_.push_back(Tensor::zeros(p->value.shape(), dtype));
  }
}

void AdamW::step(double lr) {
  ++steps_;
  const cpu::AdamWStep s = step_of(float(lr), settings_, steps_);
  for (size_t i = 0; i < params_.size(); ++i) {
    model::Parameter& p = *params_[i];
    if (p.value.dtype() == DType::F32) {
      cpu::adamw_step(p.value.f32(), p.grad.f32(), exp_avg_[i].f32(), exp_avg_sq_[i].f32(), p.value.numel(), s);
      continue;
    }
    // bf16: every element keyed by where it comes from (the parameter itself unless origins say).
    auto slice = [&](int64_t begin, int64_t end, const std::string& name, int64_t first) {
      if (begin >= end) return;
      adamw_step_bf16_slice({p.value.bf16() + begin, p.grad.bf16() + begin, exp_avg_[i].bf16() + begin,
                             exp_avg_sq_[i].bf16() + begin, end - begin, first},
                            float(lr), settings_, steps_, bf16_rounding_seed(steps_, name));
    };
    const int64_t n = p.value.numel();
    if (origins_.empty() || origins_[i].empty()) {
      slice(0, n, p.name, 0);
      continue;
    }
    std::vector<ElementOrigin> parts = origins_[i];
    std::sort(parts.begin(), parts.end(), [](const ElementOrigin& a, const ElementOrigin& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const ElementOrigin& o : parts) {
      check(o.begin >= at && o.end <= n && o.begin <= o.end, "optimizer", "overlapping element origins in " + p.name);
      slice(at, o.begin, p.name, at);  // padding before it
      slice(o.begin, o.end, o.name, o.first);
      at = o.end;
    }
    slice(at, n, p.name, at);
  }
}

std::map<std::string, Tensor> AdamW::state() const {
  std::map<std::string, Tensor> state;
  for (size_t i = 0; i < params_.size(); ++i) {
    state["exp_avg." + params_[i]->name] = exp_avg_[i];
    state["exp_avg_sq." + params_[i]->name] = exp_avg_sq_[i];
  }
  return state;
}

void AdamW::load_state(const std::map<std::string, Tensor>& state, int64_t steps, const std::string& where) {
  for (size_t i = 0; i < params_.size(); ++i) {
    for (auto [prefix, target] : {std::pair{"exp_avg.", &exp_avg_[i]}, std::pair{"exp_avg_sq.", &exp_avg_sq_[i]}}) {
      auto it = state.find(prefix + params_[i]->name);
      if (it == state.end()) throw Error(where, std::string("optimizer state has no ") + prefix + params_[i]->name);
      if (it->second.shape() != target->shape())
        throw Error(where, "optimizer state " + it->first + " has shape " + it->second.shape().str() + ", expected " +
                               target->shape().str());
      target->copy_from(it->second);
    }
  }
  steps_ = steps;
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (size_t i = 0; i < params_.size(); ++i) bytes += int64_t(exp_avg_[i].bytes() + exp_avg_sq_[i].bytes());
  return bytes;
}

void scale_gradients(const std::vector<model::Parameter*>& params, float factor) {
  for (model::Parameter* p : params) {
    if (p->grad.dtype() == DType::F32) {
      cpu::scale_inplace(p->grad.f32(), p->grad.numel(), factor);
      continue;
    }
    bf16_t* g = p->grad.bf16();
    parallel_for(p->grad.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) g[i] = f32_to_bf16(bf16_to_f32(g[i]) * factor);
    }, 1 << 16);
  }
}

double gradient_sum_of_squares(const Tensor& grad) {
  if (grad.dtype() == DType::F32) return cpu::sum_of_squares(grad.f32(), grad.numel());
  check(grad.dtype() == DType::BF16, "gradient norm", std::string("a ") + dtype_name(grad.dtype()) + " gradient");
  // Fixed blocks, each summed in f32 over short runs and in double across: the same result on any
  // thread count.
  const bf16_t* g = grad.bf16();
  const int64_t n = grad.numel(), block = 8192, blocks = (n + block - 1) / block;
  std::vector<double> partial(size_t(blocks), 0.0);
  parallel_for(blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      double acc = 0;
      for (int64_t r = b * block; r < std::min(n, (b + 1) * block); r += 1024) {
        float f = 0;
        for (int64_t i = r; i < std::min(n, r + 1024); ++i) {
          const float x = bf16_to_f32(g[i]);
          f += x * x;
        }
        acc += f;
      }
      partial[size_t(b)] = acc;
    }
  }, 4);
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

double gradient_norm(const std::vector<model::Parameter*>& params) {
  double sum = 0;
  for (model::Parameter* p : params) sum += gradient_sum_of_squares(p->grad);
  return std::sqrt(sum);
}

double clip_gradient_norm(const std::vector<model::Parameter*>& params, double max_norm) {
  double norm = gradient_norm(params);
  if (std::isfinite(max_norm) && norm > max_norm) scale_gradients(params, float(max_norm / (norm + 1e-6)));
  return norm;
}

}  // namespace ktune::train
