// Device memory and error reporting: arena slices are aligned and bounded (overflow is a ktune::Error
// naming the arena), a failing CUDA call becomes a ktune::Error with the file:line of the call and
// CUDA's own error name, and copies outside a buffer are refused before they reach the driver.
#include <string>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cuda/device_memory.h"

namespace ktune {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

KTUNE_CUDA_TEST(DeviceArenaHandsOutAlignedSlicesAndReportsPeak) {
  cuda::DeviceArena arena("activations", 4096);
  char* a = static_cast<char*>(arena.allocate(10));
  char* b = static_cast<char*>(arena.allocate(100));
  CHECK(reinterpret_cast<uintptr_t>(a) % 256 == 0 && reinterpret_cast<uintptr_t>(b) % 256 == 0);
  CHECK(b - a == 256) << (b - a);
  CHECK(arena.used() == 356 && arena.peak() == 356) << arena.used() << " " << arena.peak();
  arena.reset();
  CHECK(arena.used() == 0 && arena.peak() == 356);
  CHECK(static_cast<char*>(arena.allocate(4096)) == a) << "after reset the arena starts over";
  const std::string e = error_of([&] { arena.allocate(1); });
  CHECK(e.find("device arena activations") != std::string::npos) << e;
}

KTUNE_CUDA_TEST(CudaErrorsBecomeKtuneErrorsWithFileAndLine) {
  const std::string e = error_of([] { cuda::DeviceBuffer huge(size_t(1) << 52); });  // 4 PiB
  CHECK(e.find("device_memory.cu:") != std::string::npos) << e;
  CHECK(e.find("cudaErrorMemoryAllocation") != std::string::npos) << e;
  // The failed allocation leaves the device usable.
  cuda::DeviceBuffer ok(1024);
  ok.zero();
  cuda::synchronize();
}

KTUNE_CUDA_TEST(DeviceBufferCopiesOutsideTheBufferAreRefused) {
  cuda::DeviceBuffer buf(64);
  std::vector<char> host(128);
  CHECK(error_of([&] { buf.upload(host.data(), 65); }).find("overrun") != std::string::npos);
  CHECK(error_of([&] { buf.download(host.data(), 32, 40); }).find("overrun") != std::string::npos);
  buf.upload(host.data(), 64);  // exactly the size is fine
}

}  // namespace
}  // namespace ktune
