#include "core/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace ktune {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string Shape::str() const {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + ")";
}

std::shared_ptr<Storage> Storage::allocate(size_t bytes, Device device) {
  check(device == Device::CPU, "Storage::allocate", "only CPU storage is allocated here (CUDA memory lives in kernels/cuda)");
  auto storage = std::shared_ptr<Storage>(new Storage());
  size_t rounded = (bytes + kTensorAlignment - 1) / kTensorAlignment * kTensorAlignment;
  storage->data_ = std::aligned_alloc(kTensorAlignment, rounded == 0 ? kTensorAlignment : rounded);
  if (storage->data_ == nullptr) throw Error("Storage::allocate", "out of memory allocating " + std::to_string(bytes) + " bytes");
  storage->bytes_ = bytes;
  storage->owned_ = true;
  storage->device_ = device;
  return storage;
}

std::shared_ptr<Storage> Storage::borrow(void* data, size_t bytes, std::shared_ptr<void> keep_alive, Device device) {
  auto storage = std::shared_ptr<Storage>(new Storage());
  storage->data_ = data;
  storage->bytes_ = bytes;
  storage->owned_ = false;
  storage->device_ = device;
  storage->keep_alive_ = std::move(keep_alive);
  return storage;
}

Storage::~Storage() {
  if (owned_) std::free(data_);
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (int64_t d : shape.dims) check(d >= 0, "Tensor::empty", "negative dimension in shape " + shape.str());
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = Storage::allocate(dtype_bytes(dtype, size_t(t.shape_.numel())), device);
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  t.fill_zero();
  return t;
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, std::shared_ptr<void> keep_alive, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.storage_ = Storage::borrow(data, dtype_bytes(dtype, size_t(t.shape_.numel())), std::move(keep_alive), device);
  return t;
}

// The accessors sit in loops (a row's norms, a value at a time): their checks build the error's
// strings only when they fail (check() takes them made, a heap allocation or a shape's formatting
// on every call: 200 ns a value in DoRA's magnitude loop).
void* Tensor::raw() const {
  if (!defined()) throw Error("Tensor", "use of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_;
}

float* Tensor::f32() const {
  if (dtype_ != DType::F32) throw Error("Tensor " + str(), "expected f32 data");
  return data<float>();
}

bf16_t* Tensor::bf16() const {
  if (dtype_ != DType::BF16) throw Error("Tensor " + str(), "expected bf16 data");
  return data<bf16_t>();
}

Tensor Tensor::reshape(Shape shape) const {
  check(shape.numel() == numel(), "Tensor::reshape", "cannot reshape " + shape_.str() + " to " + shape.str());
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
  check(rank() >= 1 && 0 <= begin && begin <= end && end <= dim(0), "Tensor::slice_rows",
        "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") out of " + shape_.str());
  check(dtype_ != DType::NF4, "Tensor::slice_rows", "cannot slice nf4 data by rows");
  int64_t row = numel() / (dim(0) == 0 ? 1 : dim(0));
  Tensor t = *this;
  t.offset_ += dtype_bytes(dtype_, size_t(begin * row));
  t.shape_.dims[0] = end - begin;
  return t;
}

void Tensor::fill_zero() const {
  check(device_ == Device::CPU, "Tensor::fill_zero", "CPU tensors only");
  std::memset(raw(), 0, bytes());
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_);
  std::memcpy(t.raw(), raw(), bytes());
  return t;
}

Tensor Tensor::to(DType dtype) const {
  Tensor t = empty(shape_, dtype);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  check(src.shape() == shape_, "Tensor::copy_from", "shape " + src.shape().str() + " into " + shape_.str());
  check(device_ == Device::CPU && src.device() == Device::CPU, "Tensor::copy_from", "CPU tensors only");
  const int64_t n = numel();
  if (src.dtype() == dtype_) {
    std::memcpy(raw(), src.raw(), bytes());
    return;
  }
  auto read = [&](int64_t i) -> float {
    switch (src.dtype()) {
      case DType::F32: return src.data<float>()[i];
      case DType::BF16: return bf16_to_f32(src.data<bf16_t>()[i]);
      case DType::F16: return f16_to_f32(src.data<uint16_t>()[i]);
      default: throw Error("Tensor::copy_from", std::string("cannot convert from ") + dtype_name(src.dtype()));
    }
  };
  switch (dtype_) {
    case DType::F32: for (int64_t i = 0; i < n; ++i) data<float>()[i] = read(i); break;
    case DType::BF16: for (int64_t i = 0; i < n; ++i) data<bf16_t>()[i] = f32_to_bf16(read(i)); break;
    case DType::F16: for (int64_t i = 0; i < n; ++i) data<uint16_t>()[i] = f32_to_f16(read(i)); break;
    default: throw Error("Tensor::copy_from", std::string("cannot convert to ") + dtype_name(dtype_));
  }
}

std::string Tensor::str() const { return std::string(dtype_name(dtype_)) + shape_.str(); }

}  // namespace ktune
