// Tensor: a shape, a dtype, a device tag and a view into 64-byte aligned storage.
// A Tensor owns its storage (Tensor::empty / zeros), borrows someone else's (Tensor::view, e.g.
// an mmap'ed safetensors file or an Arena), and is cheap to copy (the storage is shared).
// It deliberately has no arithmetic and no autograd: kernels take raw pointers and sizes
// (kernels/), and the model calls them explicitly, forward then backward.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace ktune {

enum class Device : uint8_t { CPU, CUDA };

constexpr size_t kTensorAlignment = 64;

struct Shape {
  std::vector<int64_t> dims;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) : dims(d) {}
  explicit Shape(std::vector<int64_t> d) : dims(std::move(d)) {}

  size_t rank() const { return dims.size(); }
  int64_t operator[](size_t i) const { return dims[i]; }
  int64_t numel() const;
  std::string str() const;  // "(2, 3, 4)"
  bool operator==(const Shape& other) const { return dims == other.dims; }
  bool operator!=(const Shape& other) const { return dims != other.dims; }
};

// A block of bytes: owned (aligned heap allocation, freed on destruction) or borrowed
// (the keep_alive handle keeps an mmap or an arena alive while any view exists).
class Storage {
 public:
  static std::shared_ptr<Storage> allocate(size_t bytes, Device device = Device::CPU);
  static std::shared_ptr<Storage> borrow(void* data, size_t bytes, std::shared_ptr<void> keep_alive,
                                         Device device = Device::CPU);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Storage() = default;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = false;
  Device device_ = Device::CPU;
  std::shared_ptr<void> keep_alive_;
};

class Tensor {
 public:
  Tensor() = default;

  static Tensor empty(Shape shape, DType dtype = DType::F32, Device device = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype = DType::F32);  // CPU
  // A view of memory owned elsewhere; keep_alive (may be null) is held while the view lives.
  static Tensor view(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive = nullptr,
                     Device device = Device::CPU);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.dims.at(i); }
  size_t rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t bytes() const { return dtype_bytes(dtype_, size_t(numel())); }

  void* raw() const;
  template <typename T>
  T* data() const { return static_cast<T*>(raw()); }
  float* f32() const;    // checks dtype == F32
  bf16_t* bf16() const;  // checks dtype == BF16

  // Same storage, new shape with the same number of elements.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension, sharing storage.
  Tensor slice_rows(int64_t begin, int64_t end) const;

  void fill_zero() const;
  Tensor clone() const;                 // a deep copy on the CPU
  Tensor to(DType dtype) const;         // f32 <-> bf16 <-> f16 conversions on the CPU (copy)
  void copy_from(const Tensor& src) const;  // same shape; converts dtype if needed

  std::string str() const;  // "f32(2, 3)"

 private:
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;  // bytes into storage
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

}  // namespace ktune
