// A self-contained test harness for the CUDA kernel tests (the GPU machine has no GoogleTest).
// KTUNE_CUDA_TEST(Name) { ... } registers a case; CHECK(cond) << ... and CHECK_CLOSE(...) record a
// failure with file:line and keep going (a case fails if any check failed or it threw).
// main (cuda_test_main.cpp) runs every case, or those whose names contain argv[1], printing one
// line per case: PASS, FAIL or SKIP. With no CUDA device every case prints SKIP with the reason and
// the binary exits 77 (CTest's SKIP_RETURN_CODE), so a machine without a GPU never counts a pass.
// It deliberately has no fixtures, parameterisation or death tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <sstream>
#include <string>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/device_memory.h"

namespace ktune::cuda_test {

// Data the cases share: uniform floats in [lo, hi) from a seed, bf16 round trips, device copies.
inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<bf16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}
// The floats a bf16 path really sees: each value rounded to bf16 (nearest even) and back.
inline std::vector<float> rounded_to_bf16(const std::vector<float>& v) { return from_bf16(to_bf16(v)); }
template <typename T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(T));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
template <typename T>
std::vector<T> from_device(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  b.download(v.data(), n * sizeof(T));
  return v;
}

struct Case {
  const char* name;
  std::function<void()> body;
};

std::vector<Case>& registry();
void record_failure(const char* file, int line, const std::string& message);
int failures_in_current_case();

struct Registrar {
  Registrar(const char* name, std::function<void()> body) { registry().push_back({name, std::move(body)}); }
};

// Collects `CHECK(c) << "context"` text and records it on destruction when the check failed.
class FailureMessage {
 public:
  FailureMessage(const char* file, int line, const char* expr) : file_(file), line_(line) { os_ << expr; }
  ~FailureMessage() { record_failure(file_, line_, os_.str()); }
  template <typename T>
  FailureMessage& operator<<(const T& v) {
    os_ << (first_ ? ": " : "") << v;
    first_ = false;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  bool first_ = true;
  std::ostringstream os_;
};

// Max over i of |got - want| / (atol + rtol |want|); <= 1 means every element is within tolerance.
// worst: index of the largest; NaN in got counts as infinitely bad.
struct Closeness {
  double ratio = 0;
  int64_t worst = -1;
  double got = 0, want = 0;
};
Closeness closeness(const float* got, const float* want, int64_t n, double atol, double rtol);
std::string describe(const Closeness& c, double atol, double rtol);

}  // namespace ktune::cuda_test

#define KTUNE_CUDA_TEST_CONCAT2(a, b) a##b
#define KTUNE_CUDA_TEST_CONCAT(a, b) KTUNE_CUDA_TEST_CONCAT2(a, b)
#define KTUNE_CUDA_TEST(name)                                                                         \
  static void ktune_cuda_test_##name();                                                              \
  static ::ktune::cuda_test::Registrar KTUNE_CUDA_TEST_CONCAT(ktune_cuda_registrar_, name)(#name,    \
                                                                                  ktune_cuda_test_##name); \
  static void ktune_cuda_test_##name()

#define CHECK(cond) \
  if (cond) {       \
  } else            \
    ::ktune::cuda_test::FailureMessage(__FILE__, __LINE__, "CHECK(" #cond ") failed")

// Elementwise: |got - want| <= atol + rtol * |want| for all n (float arrays).
#define CHECK_CLOSE(got, want, n, atol, rtol)                                                        \
  if (auto ktune_c_ = ::ktune::cuda_test::closeness((got), (want), (n), (atol), (rtol)); ktune_c_.ratio <= 1.0) { \
  } else                                                                                            \
    ::ktune::cuda_test::FailureMessage(__FILE__, __LINE__, "CHECK_CLOSE(" #got ", " #want ")")       \
        << ::ktune::cuda_test::describe(ktune_c_, (atol), (rtol)) << "; "
