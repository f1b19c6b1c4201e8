// AdamW over the trainable parameters (torch.optim.AdamW: decoupled weight decay, bias correction,
// eps outside the square root), with the gradient helpers a recipe needs around it: scaling by the
// global token count, the total norm and clipping, and its state as named tensors for checkpoints.
// State is f32 (exact resume); the update itself is kernels/cpu/adamw.h.
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

class AdamW {
 public:
  AdamW(std::vector<model::Parameter*> params, AdamWSettings settings);

  // One update of every parameter with its gradient, at learning rate lr.
  void step(double lr);
  int64_t steps() const { return steps_; }
  const std::vector<model::Parameter*>& params() const { return params_; }

  // State: "exp_avg.<name>", "exp_avg_sq.<name>" (f32), and the step count.
  std::map<std::string, Tensor> state() const;
  // Restores a state() written for the same parameters; errors name the missing or misshapen entry.
  void load_state(const std::map<std::string, Tensor>& state, int64_t steps, const std::string& where);

 private:
  std::vector<model::Parameter*> params_;
  AdamWSettings settings_;
  std::vector<Tensor> exp_avg_, exp_avg_sq_;
  int64_t steps_ = 0;
};

// Every gradient times factor (1 / tokens of the global batch).
void scale_gradients(const std::vector<model::Parameter*>& params, float factor);
// √Σ‖g‖² over the parameters.
double gradient_norm(const std::vector<model::Parameter*>& params);
// torch.nn.utils.clip_grad_norm_: scales the gradients by max_norm / (norm + 1e-6) when the norm is
// larger. Returns the norm before clipping. max_norm = +inf only measures.
double clip_gradient_norm(const std::vector<model::Parameter*>& params, double max_norm);

}  // namespace ktune::train
