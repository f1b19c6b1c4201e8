#include "train/optimizer.h"

#include <cmath>

#include "core/error.h"
#include "kernels/cpu/adamw.h"

namespace ktune::train {

AdamW::AdamW(std::vector<model::Parameter*> params, AdamWSettings settings)
    : params_(std::move(params)), settings_(settings) {
  for (model::Parameter* p : params_) {
    check(p->value.defined() && p->grad.defined(), "optimizer", "parameter " + p->name + " has no gradient");
    exp_avg_.push_back(Tensor::zeros(p->value.shape()));
    exp_avg_sq_.push_back(Tensor::zeros(p->value.shape()));
  }
}

void AdamW::step(double lr) {
  ++steps_;
  cpu::AdamWStep s;
  s.lr = float(lr);
  s.beta1 = float(settings_.beta1);
  s.beta2 = float(settings_.beta2);
  s.eps = float(settings_.eps);
  s.weight_decay = float(settings_.weight_decay);
  s.step = steps_;
  for (size_t i = 0; i < params_.size(); ++i)
    cpu::adamw_step(params_[i]->value.f32(), params_[i]->grad.f32(), exp_avg_[i].f32(), exp_avg_sq_[i].f32(),
                    params_[i]->value.numel(), s);
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

void scale_gradients(const std::vector<model::Parameter*>& params, float factor) {
  for (model::Parameter* p : params) cpu::scale_inplace(p->grad.f32(), p->grad.numel(), factor);
}

double gradient_norm(const std::vector<model::Parameter*>& params) {
  double sum = 0;
  for (model::Parameter* p : params) sum += cpu::sum_of_squares(p->grad.f32(), p->grad.numel());
  return std::sqrt(sum);
}

double clip_gradient_norm(const std::vector<model::Parameter*>& params, double max_norm) {
  double norm = gradient_norm(params);
  if (std::isfinite(max_norm) && norm > max_norm) scale_gradients(params, float(max_norm / (norm + 1e-6)));
  return norm;
}

}  // namespace ktune::train
