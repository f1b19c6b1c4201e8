// Rotary position embeddings in the Hugging Face half-split layout (rotate_half: element i pairs
// with i + D/2), with the frequency scalings HF's rope_scaling names: none, "linear", "llama3".
// The table is computed in f32 the way HF computes it (inv_freq, then position * inv_freq).
// It deliberately does not support Meta's interleaved (adjacent pairs) layout, nor YaRN/dynamic NTK:
// RopeTable throws ktune::Error for an unknown rope_scaling type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ktune::cpu {

struct RopeScaling {
  std::string type;  // "" none, "llama3", "linear" ("default" is accepted as none)
  float factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 8192;
};

class RopeTable {
 public:
  RopeTable(int64_t head_dim, float theta, const RopeScaling& scaling, int64_t max_positions);

  int64_t head_dim() const { return head_dim_; }
  int64_t max_positions() const { return max_positions_; }
  const std::vector<float>& inv_freq() const { return inv_freq_; }  // (head_dim/2)
  // (head_dim/2) values for one position; pos must be in [0, max_positions).
  const float* cos(int64_t pos) const { return cos_.data() + pos * (head_dim_ / 2); }
  const float* sin(int64_t pos) const { return sin_.data() + pos * (head_dim_ / 2); }

 private:
  int64_t head_dim_, max_positions_;
  std::vector<float> inv_freq_;
  std::vector<float> cos_, sin_;  // (max_positions, head_dim/2)
};

// In place: x (N, H, D) rotated by the angle of positions[n] (N). Throws ktune::Error for a
// position outside the table.  x[i] <- x[i]*cos - x[i+D/2]*sin ; x[i+D/2] <- x[i+D/2]*cos + x[i]*sin
void rope_forward(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D);
// In place, the inverse rotation (the transpose): dx (N, H, D) from dy in the same buffer.
void rope_backward(float* dx, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D);

void rope_forward_reference(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H,
                            int64_t D);
void rope_backward_reference(float* dx, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H,
                             int64_t D);

}  // namespace ktune::cpu
