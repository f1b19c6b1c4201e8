// DeviceBuffer, DeviceArena, copies, the error-to-ktune::Error conversion and the index flag.
#include "kernels/cuda/device_memory.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"

namespace ktune::cuda {

void throw_cuda_error(int code, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  auto err = static_cast<cudaError_t>(code);
  throw Error(std::string(file) + ":" + std::to_string(line),
              std::string(expr) + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void throw_cublas_error(int status, const char* expr, const char* file, int line) {
  auto s = static_cast<cublasStatus_t>(status);
  throw Error(std::string(file) + ":" + std::to_string(line),
              std::string(expr) + ": " + cublasLtGetStatusName(s) + " (" + cublasLtGetStatusString(s) + ")");
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

std::string device_description() {
  int n = 0;
  cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")";
  }
  if (n == 0) return "no CUDA device: the driver reports none";
  cudaDeviceProp p{};
  KTUNE_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB, %d SMs)", p.name, p.major, p.minor,
                double(p.totalGlobalMem) / double(1ull << 30), p.multiProcessorCount);
  return buf;
}

void set_device(int index) {
  const int n = device_count();
  if (index < 0 || index >= n)
    throw Error("GPU " + std::to_string(index), "no such device: " + std::to_string(n) + " visible (LOCAL_RANK and " +
                                                "CUDA_VISIBLE_DEVICES choose among them)");
  KTUNE_CUDA_CHECK(cudaSetDevice(index));
}

void device_memory_info(size_t* used, size_t* total) {
  size_t free_bytes = 0, total_bytes = 0;
  KTUNE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (used) *used = total_bytes - free_bytes;
  if (total) *total = total_bytes;
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) KTUNE_CUDA_CHECK(cudaMalloc(&data_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (data_) cudaFree(data_);  // no throw from a destructor; a failed free leaks at worst
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  check(offset + bytes <= bytes_, "DeviceBuffer::upload",
        std::to_string(bytes) + " bytes at " + std::to_string(offset) + " overrun a buffer of " + std::to_string(bytes_));
  if (bytes) KTUNE_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  check(offset + bytes <= bytes_, "DeviceBuffer::download",
        std::to_string(bytes) + " bytes at " + std::to_string(offset) + " overrun a buffer of " + std::to_string(bytes_));
  if (bytes) KTUNE_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::zero() {
  if (bytes_) KTUNE_CUDA_CHECK(cudaMemset(data_, 0, bytes_));
}

DeviceArena::DeviceArena(std::string name, size_t bytes) : name_(std::move(name)), buffer_(bytes) {}

void* DeviceArena::allocate(size_t bytes) {
  constexpr size_t kAlign = 256;
  size_t begin = (offset_ + kAlign - 1) / kAlign * kAlign;
  if (begin + bytes > buffer_.bytes())
    throw Error("device arena " + name_, "cannot allocate " + std::to_string(bytes) + " bytes: " +
                                             std::to_string(begin) + " of " + std::to_string(buffer_.bytes()) +
                                             " already in use");
  offset_ = begin + bytes;
  if (offset_ > peak_) peak_ = offset_;
  return static_cast<char*>(buffer_.data()) + begin;
}

void copy_to_device(void* device, const void* host, size_t bytes) {
  if (bytes) KTUNE_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
}

void copy_to_host(void* host, const void* device, size_t bytes) {
  if (bytes) KTUNE_CUDA_CHECK(cudaMemcpy(host, device, bytes, cudaMemcpyDeviceToHost));
}

void copy_on_device(void* to, const void* from, size_t bytes) {
  if (bytes) KTUNE_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, nullptr));
}

void synchronize() { KTUNE_CUDA_CHECK(cudaDeviceSynchronize()); }

IndexFlag::IndexFlag() : buffer_(sizeof(int32_t)) { reset(); }

void IndexFlag::reset() {
  int32_t none = kNoBadIndex;
  buffer_.upload(&none, sizeof none);
}

int32_t IndexFlag::first_bad_row() {
  int32_t row = kNoBadIndex;
  buffer_.download(&row, sizeof row);
  return row;
}

void IndexFlag::check(const std::string& op) {
  int32_t row = first_bad_row();
  if (row != kNoBadIndex) {
    reset();
    throw Error(op + ": row " + std::to_string(row), "index outside its table (the row's output was left zero)");
  }
}

}  // namespace ktune::cuda
