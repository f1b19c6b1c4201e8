// Device memory for the CUDA backend: a DeviceBuffer owns one cudaMalloc (move-only, freed on
// destruction), and a DeviceArena carves aligned slices out of one buffer allocated once (bump
// allocation, reset between uses), tracking the planned size and the peak actually used, so a run
// can print both. Plus host<->device copies and the question "is there a GPU at all?".
// It deliberately never uses managed (unified) memory and never grows an arena behind the caller's
// back: running out is a ktune::Error naming the arena and the sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ktune::cuda {

// Number of usable CUDA devices; 0 (never an exception) when there is no driver or no GPU.
int device_count();
// "NVIDIA H200 (sm_90, 139.8 GiB)" for device 0, or why there is none.
std::string device_description();

// Makes GPU `index` this host thread's device (cudaSetDevice): a distributed worker's LOCAL_RANK,
// before it allocates anything or joins an NCCL group. Throws naming the index and the count when
// there is no such device.
void set_device(int index);
// Bytes in use on the device (total - free, as the driver reports) and the total.
void device_memory_info(size_t* used, size_t* total);

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);  // cudaMalloc; 0 bytes holds nullptr
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data_); }
  size_t bytes() const { return bytes_; }

  void upload(const void* host, size_t bytes, size_t offset = 0);          // synchronous
  void download(void* host, size_t bytes, size_t offset = 0) const;        // synchronous
  void zero();                                                             // synchronous

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// One allocation, sliced. Slices are 256-byte aligned (cuBLASLt and vector loads want >= 16).
class DeviceArena {
 public:
  DeviceArena(std::string name, size_t bytes);
  void* allocate(size_t bytes);  // throws ktune::Error when the arena is full
  template <typename T>
  T* allocate_n(size_t n) { return static_cast<T*>(allocate(n * sizeof(T))); }
  void reset() { offset_ = 0; }  // every slice handed out becomes invalid
  void* data() const { return buffer_.data(); }  // the first slice's start
  size_t capacity() const { return buffer_.bytes(); }
  size_t used() const { return offset_; }
  size_t peak() const { return peak_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  DeviceBuffer buffer_;
  size_t offset_ = 0, peak_ = 0;
};

void copy_to_device(void* device, const void* host, size_t bytes);
void copy_to_host(void* host, const void* device, size_t bytes);
void copy_on_device(void* to, const void* from, size_t bytes);  // enqueued on the default stream (no overlap)
void synchronize();  // cudaDeviceSynchronize, checked: where a kernel fault surfaces

// Index checks on the device. Kernels that take token ids, labels or positions record the first
// bad row in a device int (kNoBadIndex when all were valid) instead of reading outside a table;
// check_index_flag copies it back (synchronising) and throws ktune::Error naming op and row.
constexpr int32_t kNoBadIndex = 0x7fffffff;
class IndexFlag {
 public:
  IndexFlag();
  int32_t* data() const { return buffer_.as<int32_t>(); }
  void reset();                        // to kNoBadIndex
  void check(const std::string& op);  // throws ktune::Error("<op>: row R", ...) if a bad index was seen
  int32_t first_bad_row();             // kNoBadIndex when none

 private:
  DeviceBuffer buffer_;
};

}  // namespace ktune::cuda
