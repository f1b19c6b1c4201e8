// The tensor-core fragments the wmma kernels use (included by .cu files only): bf16 16x16x16 inputs
// in either storage order, f32 accumulators. Only load, store and mma touch them, so no kernel
// depends on which lane holds which element (the host emulator scrambles that layout to check).
#pragma once

#include <cuda_bf16.h>
#include <mma.h>

namespace ktune::cuda::wmma_bf16 {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;         // A(m, k) = p[m*ld + k]
using FragAColumns = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;  // A(m, k) = p[k*ld + m]
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;         // B(k, n) = p[k*ld + n]
using FragBColumns = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;  // B(k, n) = p[n*ld + k]
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

}  // namespace ktune::cuda::wmma_bf16
