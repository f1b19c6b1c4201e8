// A projection's frozen base weight W (out, in) held only in NF4: QLoRA's base, torchao's codes and
// double-quantised scales (kernels/cpu/nf4.h), made from the Linear's weight (f32, or bf16 / another
// dtype read as the model stores it) a chunk of whole blocks at a time, after which the weight's value
// is freed: W is never rebuilt whole in training. Held by the adapters that compute on an NF4 base:
// LoraAdapter under LoraOptions::quantize_base, and FrozenNf4Adapter (a layer projection without
// LoRA, which torchtune's Llama, Mistral and Gemma QLoRA builders quantise too).
// On demand (a GPU run's host model, whose GPU quantises its own copy): the weight stays the Linear's
// value and codes are made only when dequantized() needs them (a save's merge); the passes refuse.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/nf4.h"
#include "model/linear.h"

namespace ktune::model {

class Nf4Base {
 public:
  // Freezes base.weight (no gradient) and, unless on_demand, quantises it and frees its value.
  // Refuses a weight whose out * in is not a whole number of NF4 blocks, naming the module.
  Nf4Base(Linear& base, cpu::Nf4Arithmetic arithmetic, bool on_demand);

  cpu::Nf4Arithmetic arithmetic() const { return arithmetic_; }
  bool on_demand() const { return on_demand_; }
  const uint8_t* codes() const { return codes_.data(); }   // (out * in / 2), two codes a byte
  const cpu::Nf4Scales& scales() const { return scales_; }  // (out * in / 64 blocks), torchao's int8 scalers

  // W (out, in) as f32, dequantised (on demand: from codes made for this call only, from base's value).
  Tensor dequantized(const Linear& base) const;
  // Rows [first_row, first_row + count) of W dequantised into rows (count, in).
  void dequantize_rows(float* rows, int64_t first_row, int64_t count) const;
  // y (N, out) = x (N, in) Wᵀ (+ bias (out), f32, when not nullptr).
  void forward(float* y, const float* x, int64_t N, const float* bias = nullptr);
  // dx (N, in) += dy (N, out) W.
  void backward_input(float* dx, const float* dy, int64_t N);

  // Bytes of codes and scales held (none made on demand, none once released).
  size_t bytes() const { return codes_.size() + scales_.bytes(); }
  // Frees the codes and scales (a host model that neither computes nor merges any more); every
  // other call refuses afterwards, naming the module.
  void release();
  // Refuses (naming the module) once released, or for a base made on demand: nothing to compute on.
  void check_computes() const;

 private:
  void check_held() const;

  std::string module_;
  int64_t in_ = 0, out_ = 0;
  cpu::Nf4Arithmetic arithmetic_;
  bool on_demand_ = false;
  bool released_ = false;
  std::vector<uint8_t> codes_;
  cpu::Nf4Scales scales_;
  std::vector<float> scratch_;  // nf4_linear_forward / _backward_input's: a block of W's rows
};

}  // namespace ktune::model
