// AdamW over the trainable parameters (torch.optim.AdamW: decoupled weight decay, bias correction,
// eps outside the square root), with the gradient helpers a recipe needs around it: scaling by the
// global token count, the total norm and clipping, and its state as named tensors for checkpoints.
// The update itself is kernels/cpu/adamw.h. Each parameter is optimised in its own dtype:
//   f32 parameters (f32 runs; LoRA/DoRA adapters always): f32 moments, adamw_step (exact resume).
//   bf16 parameters (dtype=bf16: pure bf16 as torchtune trains): bf16 gradient and moments, the
//     update through adamw_step_bf16 in f32 arithmetic with param, m and v rounded stochastically,
//     so that updates far below a bf16 ulp still move the weight by the right amount on average.
//     The random bits of an element depend only on (step, parameter name, index in the parameter)
//     (see ElementOrigin): a resumed run continues bit for bit, and a sharded run, whose optimizer
//     sees flats of many parameters split across ranks, rounds every element as an unsharded one.
// Norms and scaling read bf16 gradients widened, sums in double.
// It deliberately does not shard anything: a sharded recipe gives it the shards it owns.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/linear.h"

namespace ktune::train {

struct AdamWSettings {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// Elements [begin, end) of an optimizer parameter are elements [first, first + end - begin) of the
// model parameter `name` (a sharded flat holds parts of several). Elements no origin covers (flat
// padding) are keyed by the optimizer parameter's own name and index.
struct ElementOrigin {
  int64_t begin = 0, end = 0;
  std::string name;
  int64_t first = 0;
};

class AdamW {
 public:
  // origins: one list per parameter, or empty (every parameter is itself, whole).
  AdamW(std::vector<model::Parameter*> params, AdamWSettings settings,
        std::vector<std::vector<ElementOrigin>> origins = {});

  // One update of every parameter with its gradient, at learning rate lr.
  void step(double lr);
  int64_t steps() const { return steps_; }
  const std::vector<model::Parameter*>& params() const { return params_; }

  // State: "exp_avg.<name>", "exp_avg_sq.<name>" (in the parameter's dtype: f32 or bf16), and the step count.
  std::map<std::string, Tensor> state() const;
  // Restores a state() written for the same parameters (converting dtypes if a checkpoint's differ);
  // errors name the missing or misshapen entry.
  void load_state(const std::map<std::string, Tensor>& state, int64_t steps, const std::string& where);
  // Bytes of the moments.
  int64_t state_bytes() const;

 private:
  std::vector<model::Parameter*> params_;
  AdamWSettings settings_;
  std::vector<std::vector<ElementOrigin>> origins_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

// The seed of the stochastic rounding of parameter `name`'s update at 1-based `step`: element j of
// the parameter gets the random bits adamw_step_bf16(seed) gives index j of a whole-tensor call.
uint64_t bf16_rounding_seed(int64_t step, const std::string& name);
// splitmix64's finaliser (as kernels/cpu/adamw.cpp mixes) and its inverse: unmix64(mix64(x)) == x.
uint64_t mix64(uint64_t x);
uint64_t unmix64(uint64_t x);
// adamw_step_bf16 on elements [first, first + n) of a tensor whose whole-tensor call would use
// `seed`: the same bits for every element (split into power-of-two aligned blocks, each called with
// the seed that shifts the kernel's counter to the block's start). grad is bf16 here, widened per block.
struct AdamWBf16Slice {
  bf16_t* param;
  const bf16_t* grad;
  bf16_t *m, *v;
  int64_t n;      // elements from these pointers on
  int64_t first;  // their index in the keyed tensor
};
void adamw_step_bf16_slice(const AdamWBf16Slice& slice, float lr, const AdamWSettings& settings, int64_t step,
                           uint64_t seed);

// Every gradient times factor (1 / tokens of the global batch); bf16 gradients are rounded to nearest.
void scale_gradients(const std::vector<model::Parameter*>& params, float factor);
// Σ g² of one gradient (f32 or bf16), in double.
double gradient_sum_of_squares(const Tensor& grad);
// √Σ‖g‖² over the parameters.
double gradient_norm(const std::vector<model::Parameter*>& params);
// torch.nn.utils.clip_grad_norm_: scales the gradients by max_norm / (norm + 1e-6) when the norm is
// larger. Returns the norm before clipping. max_norm = +inf only measures.
double clip_gradient_norm(const std::vector<model::Parameter*>& params, double max_norm);

}  // namespace ktune::train
