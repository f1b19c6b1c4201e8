// Memory as the trainer reports it: the process's resident and peak resident bytes from
// /proc/self/status ("peak_memory_rss" in the metrics), and the trainer's own state by what it is
// (weights, gradients, AdamW moments, frozen weights) as the startup log line prints it, so that a
// pure-bf16 run visibly holds 8 bytes per trainable parameter where an f32 run holds 16.
// The engine's planned activation bytes come from the model; this file does not plan anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/linear.h"

namespace ktune {

struct MemoryStats {
  int64_t rss_bytes = 0;       // VmRSS
  int64_t peak_rss_bytes = 0;  // VmHWM
};

MemoryStats read_memory_stats();

// Bytes the trainer holds between steps, by kind.
struct TrainingStateBytes {
  int64_t trainable_elements = 0;
  int64_t weights = 0;    // trainable values
  int64_t gradients = 0;  // their gradients
  int64_t optimizer = 0;  // AdamW's two moments
  int64_t frozen = 0;     // values of frozen parameters (as stored: f32, bf16; an NF4 base is not a parameter)
  // (weights + gradients + optimizer) / trainable_elements: 16 for f32 AdamW, 8 for pure bf16.
  double bytes_per_trainable() const;
  // "weights 1.00 MiB + gradients 1.00 MiB + AdamW state 2.00 MiB (8.0 bytes per trainable parameter); frozen 3.00 MiB"
  std::string str() const;
};

// Counts `params` (a trainable one: its value and gradient; a frozen one: its value; undefined values
// count nothing) plus the optimizer's bytes.
TrainingStateBytes training_state_bytes(const std::vector<model::Parameter*>& params, int64_t optimizer_bytes);

}  // namespace ktune
