// Learning-rate schedules, as torchtune's `get_cosine_schedule_with_warmup` computes them:
// a linear warmup from 0 over num_warmup_steps, then a half cosine down to 0 at num_training_steps.
// The scheduler is a pure function of the step, so resuming needs only the step count.
#pragma once

#include <cstdint>

namespace ktune {

struct CosineWithWarmup {
  int64_t num_warmup_steps = 0;
  int64_t num_training_steps = 1;
  double num_cycles = 0.5;  // 0.5: one half cosine, from the peak to zero

  // The multiplier of the base lr at optimizer step `step` (0-based: the lr used by the first update is at 0).
  double multiplier(int64_t step) const;
};

}  // namespace ktune
