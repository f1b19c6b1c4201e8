// RoPE table (built once per model, f32 like HF) and the in-place rotation, rows in parallel.
#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune::cpu {

RopeTable::RopeTable(int64_t head_dim, float theta, const RopeScaling& scaling, int64_t max_positions)
    : head_dim_(head_dim), max_positions_(max_positions) {
  check(head_dim > 0 && head_dim % 2 == 0, "rope", "head_dim must be even and positive, got " + std::to_string(head_dim));
  check(max_positions > 0, "rope", "max_positions must be positive");
  check(theta > 0, "rope", "rope_theta must be positive");
  const int64_t half = head_dim / 2;
  inv_freq_.resize(size_t(half));
  // HF: inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), all in f32.
  for (int64_t i = 0; i < half; ++i) {
    float exponent = float(2 * i) / float(head_dim);
    inv_freq_[size_t(i)] = 1.0f / std::pow(theta, exponent);
  }
  const std::string& type = scaling.type;
  if (type == "llama3") {
    // HF _compute_llama3_parameters.
    check(scaling.factor > 0 && scaling.high_freq_factor != scaling.low_freq_factor, "rope_scaling",
          "llama3 needs factor > 0 and high_freq_factor != low_freq_factor");
    const float old_context = float(scaling.original_max_position_embeddings);
    const float low_freq_wavelen = old_context / scaling.low_freq_factor;
    const float high_freq_wavelen = old_context / scaling.high_freq_factor;
    for (auto& f : inv_freq_) {
      float wavelen = 2.0f * float(M_PI) / f;
      float scaled = wavelen > low_freq_wavelen ? f / scaling.factor : f;
      if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
        float smooth = (old_context / wavelen - scaling.low_freq_factor) /
                       (scaling.high_freq_factor - scaling.low_freq_factor);
        scaled = (1.0f - smooth) * scaled / scaling.factor + smooth * scaled;
      }
      f = scaled;
    }
  } else if (type == "linear") {
    check(scaling.factor > 0, "rope_scaling", "linear needs factor > 0");
    for (auto& f : inv_freq_) f /= scaling.factor;
  } else if (!type.empty() && type != "default") {
    throw Error("rope_scaling.rope_type", "unsupported RoPE scaling '" + type + "' (supported: none, linear, llama3)");
  }
  cos_.resize(size_t(max_positions * half));
  sin_.resize(size_t(max_positions * half));
  for (int64_t p = 0; p < max_positions; ++p)
    for (int64_t i = 0; i < half; ++i) {
      float angle = float(p) * inv_freq_[size_t(i)];  // HF: inv_freq @ positions in f32
      cos_[size_t(p * half + i)] = std::cos(angle);
      sin_[size_t(p * half + i)] = std::sin(angle);
    }
}

namespace {

void check_position(int32_t pos, int64_t n, const RopeTable& table) {
  if (pos < 0 || pos >= table.max_positions())
    throw Error("rope: token " + std::to_string(n),
                "position " + std::to_string(pos) + " outside the table of " + std::to_string(table.max_positions()));
}

// sign = +1 rotates forward, -1 applies the inverse (transpose) rotation.
void rotate(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D, float sign) {
  check(D == table.head_dim(), "rope", "head_dim " + std::to_string(D) + " != table's " + std::to_string(table.head_dim()));
  for (int64_t n = 0; n < N; ++n) check_position(positions[n], n, table);
  const int64_t half = D / 2;
  parallel_for(N, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* c = table.cos(positions[n]);
      const float* s = table.sin(positions[n]);
      for (int64_t h = 0; h < H; ++h) {
        float* lo = x + (n * H + h) * D;
        float* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          float a = lo[i], b = hi[i], si = sign * s[i];
          lo[i] = a * c[i] - b * si;
          hi[i] = b * c[i] + a * si;
        }
      }
    }
  }, std::max<int64_t>(1, 8192 / std::max<int64_t>(1, H * D)));
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D) {
  rotate(x, positions, table, N, H, D, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D) {
  rotate(dx, positions, table, N, H, D, -1.0f);
}

namespace {

// The plain reference of rotate(): double arithmetic, no threads; sign as there.
void rotate_reference(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H, int64_t D,
                      double sign) {
  const int64_t half = D / 2;
  for (int64_t n = 0; n < N; ++n) {
    check_position(positions[n], n, table);
    for (int64_t h = 0; h < H; ++h) {
      float* v = x + (n * H + h) * D;
      // HF: q * cos + rotate_half(q) * sin with cos = cat(c, c), rotate_half(q) = cat(-q2, q1).
      for (int64_t i = 0; i < half; ++i) {
        const double c = table.cos(positions[n])[i], s = sign * table.sin(positions[n])[i];
        const double a = v[i], b = v[i + half];
        v[i] = float(a * c - b * s);
        v[i + half] = float(b * c + a * s);
      }
    }
  }
}

}  // namespace

void rope_forward_reference(float* x, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H,
                            int64_t D) {
  rotate_reference(x, positions, table, N, H, D, 1.0);
}

void rope_backward_reference(float* dx, const int32_t* positions, const RopeTable& table, int64_t N, int64_t H,
                             int64_t D) {
  rotate_reference(dx, positions, table, N, H, D, -1.0);
}

}  // namespace ktune::cpu
