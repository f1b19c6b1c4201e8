// The linear ops over NF4 weights (the quantiser and the code table: nf4_codes.cpp).
#include "kernels/cpu/nf4.h"

#include <algorithm>

#include "core/parallel.h"
#include "kernels/cpu/gemm.h"

namespace ktune::cpu {

namespace {

// Rows of W dequantised per GEMM: enough for a GEMM that runs near full rate, few enough to stay in L2.
int64_t rows_per_block(int64_t in, int64_t out) {
  int64_t rows = std::max<int64_t>(16, (int64_t(1) << 18) / std::max<int64_t>(1, in));  // ~1 MiB of f32
  return std::min(out, rows);
}

// Dequantises rows [r0, r1) of W (out, in) into scratch, threads splitting the elements.
void dequantize_rows(float* scratch, const uint8_t* codes, const Nf4Scales& scales, int64_t in, int64_t r0, int64_t r1,
                     Nf4Arithmetic arithmetic) {
  const int64_t begin = r0 * in, count = (r1 - r0) * in;
  parallel_for(count, [&](int64_t e0, int64_t e1) {
    nf4_dequantize_range(scratch + e0, codes, scales, begin + e0, begin + e1, arithmetic);
  }, 16384);
}

}  // namespace

size_t nf4_linear_scratch_floats(int64_t in, int64_t out) { return size_t(rows_per_block(in, out) * in); }

void nf4_linear_forward(float* y, const float* x, const uint8_t* codes, const Nf4Scales& scales, int64_t N, int64_t in,
                        int64_t out, Nf4Arithmetic arithmetic, float* scratch) {
  nf4_check_blocks(in * out);
  const int64_t rows = rows_per_block(in, out);
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    int64_t r1 = std::min(out, r0 + rows);
    dequantize_rows(scratch, codes, scales, in, r0, r1, arithmetic);
    // y[:, r0:r1] = x (N, in) @ Wblock^T (in, r1-r0)
    gemm_strided(false, true, N, r1 - r0, in, 1.0f, x, in, scratch, in, 0.0f, y + r0, out);
  }
}

void nf4_linear_backward_input(float* dx, const float* dy, const uint8_t* codes, const Nf4Scales& scales, int64_t N,
                               int64_t in, int64_t out, Nf4Arithmetic arithmetic, float* scratch, bool accumulate_dx) {
  nf4_check_blocks(in * out);
  const int64_t rows = rows_per_block(in, out);
  for (int64_t r0 = 0; r0 < out; r0 += rows) {
    int64_t r1 = std::min(out, r0 + rows);
    dequantize_rows(scratch, codes, scales, in, r0, r1, arithmetic);
    // dx += dy[:, r0:r1] (N, r1-r0) @ Wblock (r1-r0, in)
    float beta = (r0 == 0 && !accumulate_dx) ? 0.0f : 1.0f;
    gemm_strided(false, false, N, in, r1 - r0, 1.0f, dy + r0, out, scratch, in, beta, dx, in);
  }
}

}  // namespace ktune::cpu
