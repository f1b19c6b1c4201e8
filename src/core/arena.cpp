#include "core/arena.h"

#include "core/error.h"

namespace ktune {

static size_t align_up(size_t n) { return (n + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment; }

size_t arena_bytes(const Shape& shape, DType dtype) { return align_up(dtype_bytes(dtype, size_t(shape.numel()))); }

Arena::Arena(size_t capacity_bytes) : block_(Storage::allocate(align_up(capacity_bytes))), capacity_(align_up(capacity_bytes)) {}

Tensor Arena::take(Shape shape, DType dtype) {
  size_t need = arena_bytes(shape, dtype);
  if (used_ + need > capacity_) {
    throw Error("Arena", "out of planned memory: need " + std::to_string(need) + " bytes for " + shape.str() + ", " +
                             std::to_string(capacity_ - used_) + " of " + std::to_string(capacity_) + " left");
  }
  void* p = static_cast<char*>(block_->data()) + used_;
  used_ += need;
  if (used_ > peak_) peak_ = used_;
  return Tensor::view(p, std::move(shape), dtype, block_);
}

void Arena::release(size_t mark) {
  check(mark <= used_, "Arena::release", "mark beyond the used size");
  used_ = mark;
}

}  // namespace ktune
