// KTUNE_BF16_GEMM for one scope: `widen` or `bf16` (cpu::bf16_weights_use_bf16_gemm reads it on every
// call; the decoder plans again when the answer changes). Restores what was set before.
#pragma once

#include <cstdlib>
#include <string>

namespace ktune::testing {

class ScopedBf16Gemm {
 public:
  explicit ScopedBf16Gemm(const char* mode) {
    if (const char* old = std::getenv("KTUNE_BF16_GEMM")) saved_ = old;
    setenv("KTUNE_BF16_GEMM", mode, 1);
  }
  ~ScopedBf16Gemm() {
    if (saved_.empty()) unsetenv("KTUNE_BF16_GEMM");
    else setenv("KTUNE_BF16_GEMM", saved_.c_str(), 1);
  }
  ScopedBf16Gemm(const ScopedBf16Gemm&) = delete;
  ScopedBf16Gemm& operator=(const ScopedBf16Gemm&) = delete;

 private:
  std::string saved_;
};

}  // namespace ktune::testing
