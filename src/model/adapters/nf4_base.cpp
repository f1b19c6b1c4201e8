#include "model/adapters/nf4_base.h"

#include <algorithm>

#include "core/error.h"

namespace ktune::model {

namespace {

// NF4 codes and scales of an f32 or bf16 weight as the model stores it (n values): one held in
// another dtype (a GPU run's host, which maps a bf16 checkpoint rather than copy it to f32, or an
// f32 or f16 one under bf16 storage) read as stored a chunk of whole blocks at a time
// (read_stored_f32, which refuses what it cannot read), so that its codes are those of its stored
// values without an f32 copy of the weight; the scales, double quantised over the whole tensor, once
// every chunk's blocks have their absmax.
void quantize_to_nf4(uint8_t* codes, cpu::Nf4Scales& scales, const Parameter& weight, cpu::Nf4Arithmetic arithmetic) {
  const Tensor& value = weight.value;
  const int64_t n = value.numel();
  if (value.dtype() == DType::F32 && !value_in_other_dtype(weight))
    return cpu::nf4_quantize(codes, scales, value.f32(), n, arithmetic);
  constexpr int64_t kChunk = 1024 * cpu::kNf4BlockSize;
  std::vector<float> wide(size_t(std::min(n, kChunk))), absmax(size_t(n / cpu::kNf4BlockSize));
  for (int64_t first = 0; first < n; first += kChunk) {
    const int64_t m = std::min(kChunk, n - first);
    read_stored_f32(weight, first, m, wide.data());
    cpu::nf4_quantize_blocks(codes + first / 2, absmax.data() + first / cpu::kNf4BlockSize, wide.data(), m, arithmetic);
  }
  cpu::nf4_double_quantize(scales, absmax.data(), n / cpu::kNf4BlockSize, arithmetic);
}

}  // namespace

Nf4Base::Nf4Base(Linear& base, cpu::Nf4Arithmetic arithmetic, bool on_demand)
    : module_(base.name), in_(base.in), out_(base.out), arithmetic_(arithmetic), on_demand_(on_demand) {
  const int64_t n = in_ * out_;
  check(n % cpu::kNf4BlockSize == 0, module_,
        "QLoRA needs out*in divisible by " + std::to_string(cpu::kNf4BlockSize) + " (NF4 blocks), got " +
            std::to_string(n));
  base.weight->grad = Tensor();
  base.weight->trainable = false;
  if (on_demand_) return;
  codes_.resize(size_t(n / 2));
  quantize_to_nf4(codes_.data(), scales_, *base.weight, arithmetic_);
  scratch_.resize(cpu::nf4_linear_scratch_floats(in_, out_));
  base.weight->value = Tensor();  // the base weight is gone: only NF4 remains
}

void Nf4Base::check_held() const {
  check(!released_, module_, "its NF4 base was released (release_base): this host model no longer computes");
}

void Nf4Base::check_computes() const {
  check_held();
  check(!on_demand_, module_,
        "its NF4 base is made on demand (a GPU run's host model, whose GPU computes): this host model does not "
        "compute");
}

Tensor Nf4Base::dequantized(const Linear& base) const {
  check_held();
  Tensor w = Tensor::empty({out_, in_});
  if (!on_demand_) {
    cpu::nf4_dequantize(w.f32(), codes_.data(), scales_, out_ * in_, arithmetic_);
    return w;
  }
  // the codes the eager path holds, made for this call only
  check(base.weight->value.defined(), module_, "its base value was released: this host model no longer has it");
  std::vector<uint8_t> codes(size_t(out_ * in_ / 2));
  cpu::Nf4Scales scales;
  quantize_to_nf4(codes.data(), scales, *base.weight, arithmetic_);
  cpu::nf4_dequantize(w.f32(), codes.data(), scales, out_ * in_, arithmetic_);
  return w;
}

void Nf4Base::dequantize_rows(float* rows, int64_t first_row, int64_t count) const {
  check_computes();
  cpu::nf4_dequantize_range(rows, codes_.data(), scales_, first_row * in_, (first_row + count) * in_,
                            arithmetic_);
}

void Nf4Base::forward(float* y, const float* x, int64_t N, const float* bias) {
  check_computes();
  cpu::nf4_linear_forward(y, x, codes_.data(), scales_, N, in_, out_, arithmetic_, scratch_.data());
  if (!bias) return;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < out_; ++o) y[n * out_ + o] += bias[o];
}

void Nf4Base::backward_input(float* dx, const float* dy, int64_t N) {
  check_computes();
  cpu::nf4_linear_backward_input(dx, dy, codes_.data(), scales_, N, in_, out_, arithmetic_, scratch_.data(),
                                 true);
}

void Nf4Base::release() {
  std::vector<uint8_t>().swap(codes_);
  scales_ = cpu::Nf4Scales();
  std::vector<float>().swap(scratch_);
  released_ = true;
}

}  // namespace ktune::model
