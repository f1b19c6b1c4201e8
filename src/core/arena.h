// Arena: one aligned block, handed out front to back, so that a training step allocates nothing.
// The model plans its activations once (how many bytes a step needs), sizes an arena to that, and
// resets it each step. mark()/release() give stack discipline for scratch inside a layer.
// It deliberately never grows: running past the capacity is a planning bug, reported as an Error.
#pragma once

#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace ktune {

class Arena {
 public:
  explicit Arena(size_t capacity_bytes);

  Tensor take(Shape shape, DType dtype = DType::F32);  // uninitialised, 64-byte aligned
  size_t mark() const { return used_; }
  void release(size_t mark);  // frees everything taken after mark
  void reset() { used_ = 0; }

  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t capacity() const { return capacity_; }

 private:
  std::shared_ptr<Storage> block_;
  size_t capacity_ = 0;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// Bytes that take(shape, dtype) consumes, alignment included (for planning an arena's size).
size_t arena_bytes(const Shape& shape, DType dtype);

}  // namespace ktune
