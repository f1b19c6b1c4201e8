// cuBLASLt behind the row-major GEMM of kernels/cuda/gemm.h.
//
// cuBLASLt is column-major. A row-major (R, C) matrix with row stride ld is the column-major
// (C, R) matrix with leading dimension ld, i.e. its transpose. So row-major C = op(A) op(B) is
// computed as column-major C^T (N, M) = op(B)^T (N, K) @ op(A)^T (K, M): cuBLASLt's "A" is our B
// (stored, column-major, as (N, K) when !trans_b -> op N; as (K, N) when trans_b -> op T) and its
// "B" is our A likewise. The bias epilogue adds a vector over cuBLASLt's rows = our columns (N).
//
// Plans (matmul descriptor, four layouts, the heuristic's first algorithm) are cached per shape,
// transposes, leading dimensions, dtypes, bias and pointer alignment: the heuristic is told the
// actual alignment of the pointers (sub-matrix views are often not 256-byte aligned).
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/device_memory.h"

namespace ktune::cuda {
namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // NVIDIA's recommendation for Hopper

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    default: throw Error("cuda gemm", std::string("unsupported dtype ") + dtype_name(t) + " (f32 or bf16)");
  }
}

uint32_t alignment_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && (a % align) != 0) align /= 2;
  return align;
}

// out-of-place scale for K == 0: C = beta * C (C untouched is wrong when beta != 1; beta == 0 writes 0).
template <typename T>
__global__ void scale_matrix(T* C, int64_t M, int64_t N, int64_t ldc, float beta) {
  int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= M * N) return;
  int64_t r = idx / N, c = idx % N;
  float v = beta == 0.0f ? 0.0f : beta * load_f32(C, r * ldc + c);
  store_f32(C, r * ldc + c, v);
}

}  // namespace

struct GemmContext::State {
  using PlanKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int, int, bool, uint32_t,
                             uint32_t, uint32_t, uint32_t, int64_t, int64_t, int64_t, int64_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  // Made by the first product (ensure_handle), so that a context nothing multiplies with touches no
  // device: Decoder::plan builds one to plan memory on a machine without a GPU.
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer workspace;
  std::map<PlanKey, Plan> plans;
  int64_t calls = 0;

  void ensure_handle() {
    if (handle) return;
    workspace = DeviceBuffer(kWorkspaceBytes);
    KTUNE_CUBLAS_CHECK(cublasLtCreate(&handle));
  }
};

GemmContext::GemmContext() : state_(std::make_unique<State>()) {}

GemmContext::~GemmContext() {
  for (auto& [key, p] : state_->plans) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (state_->handle) cublasLtDestroy(state_->handle);
}

int64_t GemmContext::cached_plans() const { return int64_t(state_->plans.size()); }
int64_t GemmContext::calls() const { return state_->calls; }

void GemmContext::run(const GemmCall& g, Stream stream) {
  const GemmLeadingDims ld = checked_leading_dims(g);
  if (g.M == 0 || g.N == 0) return;
  const int64_t lda = ld.lda, ldb = ld.ldb, ldc = ld.ldc;
  ++state_->calls;
  if (g.K == 0) {
    int64_t n = g.M * g.N;
    unsigned blocks = unsigned((n + 255) / 256);
    if (g.out == DType::F32)
      scale_matrix<float><<<blocks, 256, 0, stream>>>(static_cast<float*>(g.C), g.M, g.N, ldc, g.beta);
    else
      scale_matrix<__nv_bfloat16><<<blocks, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(g.C), g.M, g.N, ldc, g.beta);
    KTUNE_CUDA_CHECK_LAUNCH();
    return;
  }
  uint32_t align_a = alignment_of(g.A), align_b = alignment_of(g.B), align_c = alignment_of(g.C);
  const uint32_t align_bias = g.bias ? alignment_of(g.bias) : 256;
  const int64_t batch = g.batch, stride_a = batch > 1 ? g.stride_a : 0, stride_b = batch > 1 ? g.stride_b : 0,
                stride_c = batch > 1 ? g.stride_c : 0;
  if (batch > 1) {  // every product of the batch must be as aligned as the heuristic is told
    const size_t in_bytes = g.in == DType::F32 ? 4 : 2, out_bytes = g.out == DType::F32 ? 4 : 2;
    auto aligned_to = [](int64_t stride, size_t bytes) {
      return alignment_of(reinterpret_cast<const void*>(uintptr_t(stride) * bytes));
    };
    align_a = std::min(align_a, aligned_to(stride_a, in_bytes));
    align_b = std::min(align_b, aligned_to(stride_b, in_bytes));
    align_c = std::min(align_c, aligned_to(stride_c, out_bytes));
  }
  State::PlanKey key{g.trans_a, g.trans_b, g.M, g.N, g.K, lda, ldb, ldc, int(g.in), int(g.out), g.bias != nullptr,
              align_a, align_b, align_c, align_bias, batch, stride_a, stride_b, stride_c};
  state_->ensure_handle();
  auto it = state_->plans.find(key);
  if (it == state_->plans.end()) {
    State::Plan p;
    const cudaDataType_t in = cuda_type(g.in), out = cuda_type(g.out);
    KTUNE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // cuBLASLt's A is our B, its B our A (see the top of the file).
    cublasOperation_t op_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t op_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KTUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
    KTUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
    if (g.bias) {
      cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      KTUNE_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      cudaDataType_t bias_type = out;
      KTUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                        sizeof bias_type));
      // The heuristic reads the bias pointer's value for the alignment it may assume (cublasLt.h):
      // set before it runs, not only before each matmul (align_bias is in the key).
      const void* bias = g.bias;
      KTUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    // Stored column-major shapes: ours-B is (N, K) or (K, N); ours-A is (K, M) or (M, K); C is (N, M).
    KTUNE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, g.trans_b ? g.K : g.N, g.trans_b ? g.N : g.K, ldb));
    KTUNE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, g.trans_a ? g.M : g.K, g.trans_a ? g.K : g.M, lda));
    KTUNE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out, g.N, g.M, ldc));
    if (batch > 1) {  // cuBLASLt's A is our B: its strides swap likewise
      const int32_t count = int32_t(batch);
      const int64_t strides[3] = {stride_b, stride_a, stride_c};
      cublasLtMatrixLayout_t layouts[3] = {p.a, p.b, p.c};
      for (int i = 0; i < 3; ++i) {
        KTUNE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                            sizeof count));
        KTUNE_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
            layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i], sizeof strides[i]));
      }
    }

    cublasLtMatmulPreference_t pref = nullptr;
    KTUNE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = kWorkspaceBytes;  // the attribute is a uint64_t
    // cuBLASLt's A is our B and vice versa.
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[4] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}};
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    for (const auto& [attribute, bytes] : alignments)
      if (st == CUBLAS_STATUS_SUCCESS) st = cublasLtMatmulPreferenceSetAttribute(pref, attribute, &bytes, sizeof bytes);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulAlgoGetHeuristic(state_->handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      cublasLtMatmulDescDestroy(p.desc);
      throw Error("cuda gemm",
                  "cuBLASLt has no algorithm for M=" + std::to_string(g.M) + " N=" + std::to_string(g.N) +
                      " K=" + std::to_string(g.K) + " trans_a=" + std::to_string(g.trans_a) + " trans_b=" +
                      std::to_string(g.trans_b) + " in=" + dtype_name(g.in) + " out=" + dtype_name(g.out) + ": " +
                      cublasLtGetStatusName(st));
    }
    p.algo = result.algo;
    it = state_->plans.emplace(key, p).first;
  }
  State::Plan& p = it->second;
  if (g.bias) {
    const void* bias = g.bias;
    KTUNE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
  }
  KTUNE_CUBLAS_CHECK(cublasLtMatmul(state_->handle, p.desc, &g.alpha, g.B, p.a, g.A, p.b, &g.beta, g.C, p.c, g.C, p.c,
                                    &p.algo, state_->workspace.data(), kWorkspaceBytes, stream));
}

}  // namespace ktune::cuda
