#include "train/lr_scheduler.h"

#include <algorithm>
#include <cmath>

namespace ktune {

double CosineWithWarmup::multiplier(int64_t step) const {
  if (step < num_warmup_steps) return double(step) / double(std::max<int64_t>(1, num_warmup_steps));
  double progress = double(step - num_warmup_steps) / double(std::max<int64_t>(1, num_training_steps - num_warmup_steps));
  double cosine = 0.5 * (1.0 + std::cos(M_PI * num_cycles * 2.0 * progress));
  return std::max(0.0, cosine);
}

}  // namespace ktune
