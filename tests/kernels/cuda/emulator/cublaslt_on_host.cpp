// fake/cublasLt.h's functions: cuBLASLt's matmul computed on the host, as its header documents it,
// with its refusals and the emulator's checks (see fake/cublasLt.h for what and why). "Device"
// memory is host memory under the emulator, so the operands are read in place; like the emulator's
// kernels, a matmul runs when it is called, whatever its stream.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"

struct cublasLtContext {
  int magic = 0x11;
};

struct cublasLtMatmulDescOpaque_t {
  int32_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const void* bias = nullptr;
  int32_t bias_type = -1;  // -1: D's type
  int64_t bias_batch_stride = 0;
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type = CUDA_R_32F;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  int32_t batch = 1;
  int64_t batch_stride = 0;  // elements
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_workspace = 0;
  uint32_t align[4] = {256, 256, 256, 256};  // A, B, C, D: cublasLt.h's defaults
};

namespace {

using emu::fail;

// What an algorithm was chosen for: the operation's kind (types, transposes, epilogue) and what it
// may assume of the pointers and the workspace. cublasLtMatmul checks its call against it.
struct AlgoProblem {
  int32_t trans_a, trans_b;
  uint32_t epilogue;
  cudaDataType_t a_type, b_type, c_type, d_type, bias_type;
  uint32_t align[5];  // A, B, C, D, bias: bytes
  size_t workspace;
};

std::mutex g_algos_mutex;
std::vector<AlgoProblem> g_algos;  // algo.data[0] - 1 indexes it
constexpr uint64_t kAlgoMagic = 0x6b74756e65ull;

size_t type_bytes(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }
bool known_type(int t) { return t == CUDA_R_32F || t == CUDA_R_16F || t == CUDA_R_16BF; }

uint32_t alignment_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

template <typename T>
cublasStatus_t read_attribute(T& into, const void* buf, size_t bytes) {
  if (buf == nullptr || bytes != sizeof(T)) return CUBLAS_STATUS_INVALID_VALUE;  // "doesn't match internal storage"
  std::memcpy(&into, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

[[noreturn]] void fail_with(const std::string& what) { fail(("cuBLASLt: " + what).c_str()); }

bool transposed(int32_t op) { return op != CUBLAS_OP_N; }  // OP_C is OP_T for real types

// The (m, n, k) of a matmul, or INVALID_VALUE when the layouts do not fit the operation (cublasLt.h:
// "parameters are in conflict or in an impossible configuration").
struct Shape {
  uint64_t m = 0, n = 0, k = 0;
  cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
};

Shape shape_of(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
               const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& c,
               const cublasLtMatrixLayoutOpaque_t& d) {
  Shape s;
  s.m = d.rows, s.n = d.cols;
  s.k = transposed(op.trans_a) ? a.rows : a.cols;
  const uint64_t a_m = transposed(op.trans_a) ? a.cols : a.rows;
  const uint64_t b_k = transposed(op.trans_b) ? b.cols : b.rows, b_n = transposed(op.trans_b) ? b.rows : b.cols;
  bool fits = a_m == s.m && b_k == s.k && b_n == s.n && c.rows == d.rows && c.cols == d.cols && c.type == d.type;
  for (const auto* l : {&a, &b, &c, &d}) fits = fits && l->ld >= int64_t(std::max<uint64_t>(1, l->rows));
  fits = fits && a.batch == d.batch && b.batch == d.batch && c.batch == d.batch;
  if (!fits) s.status = CUBLAS_STATUS_INVALID_VALUE;
  if (fits && (s.m == 0 || s.n == 0 || s.k == 0)) fail_with("an empty product (not emulated; ktune never asks for one)");
  return s;
}

// The bias's type as the matmul reads it (BIAS_DATA_TYPE -1: D's).
cudaDataType_t bias_type_of(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& d) {
  return op.bias_type == -1 ? d.type : cudaDataType_t(op.bias_type);
}

// Whether cuBLASLt has kernels for these types under CUBLAS_COMPUTE_32F with f32 scale: A and B
// alike, bf16 or f16 with a D of theirs or f32, or f32 throughout; a bias of D's type.
bool supported_types(const cublasLtMatmulDescOpaque_t& op, const cublasLtMatrixLayoutOpaque_t& a,
                     const cublasLtMatrixLayoutOpaque_t& b, const cublasLtMatrixLayoutOpaque_t& d) {
  if (a.type != b.type) return false;
  const bool types = a.type == CUDA_R_32F ? d.type == CUDA_R_32F : (d.type == a.type || d.type == CUDA_R_32F);
  const bool bias = op.epilogue != CUBLASLT_EPILOGUE_BIAS || bias_type_of(op, d) == d.type;
  return types && bias;
}

float load(const void* base, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  if (t == CUDA_R_16BF) return ktune::bf16_to_f32(static_cast<const ktune::bf16_t*>(base)[i]);
  fail_with("f16 data (not emulated)");
}

void store(void* base, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_32F)
    static_cast<float*>(base)[i] = v;
  else if (t == CUDA_R_16BF)
    static_cast<ktune::bf16_t*>(base)[i] = ktune::f32_to_bf16(v);
  else
    fail_with("f16 data (not emulated)");
}

// The bytes a layout's batch spans from its pointer: [0, extent).
uint64_t extent_bytes(const cublasLtMatrixLayoutOpaque_t& l) {
  const uint64_t last = uint64_t(l.batch - 1) * uint64_t(l.batch_stride) + (l.cols - 1) * uint64_t(l.ld) + l.rows;
  return last * type_bytes(l.type);
}

bool overlap(const void* p, uint64_t p_bytes, const void* q, uint64_t q_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(q);
  return a < b + q_bytes && b < a + p_bytes;
}

// Every product's pointer of a batch at least `need` bytes aligned.
void check_alignment(const char* name, const void* p, const cublasLtMatrixLayoutOpaque_t& l, uint32_t need) {
  for (int32_t i = 0; i < l.batch; ++i) {
    const void* at = static_cast<const char*>(p) + uint64_t(i) * uint64_t(l.batch_stride) * type_bytes(l.type);
    if (alignment_of(at) < need)
      fail_with(std::string("matrix ") + name + " of product " + std::to_string(i) + " is " +
                std::to_string(alignment_of(at)) + "-byte aligned; its algorithm was chosen for " +
                std::to_string(need) + " (the preference's MIN_ALIGNMENT or the heuristic's bias pointer)");
  }
}

}  // namespace

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cublasLtContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute, cudaDataType_t scale) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (compute != CUBLAS_COMPUTE_32F || scale != CUDA_R_32F)
    fail_with("compute type " + std::to_string(int(compute)) + " / scale type " + std::to_string(int(scale)) +
              " (only CUBLAS_COMPUTE_32F with CUDA_R_32F is emulated)");
  *desc = new cublasLtMatmulDescOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void* buf, size_t bytes) {
  if (desc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: return read_attribute(desc->trans_a, buf, bytes);
    case CUBLASLT_MATMUL_DESC_TRANSB: return read_attribute(desc->trans_b, buf, bytes);
    case CUBLASLT_MATMUL_DESC_EPILOGUE: {
      uint32_t e = 0;
      const cublasStatus_t st = read_attribute(e, buf, bytes);
      if (st == CUBLAS_STATUS_SUCCESS && e != CUBLASLT_EPILOGUE_DEFAULT && e != CUBLASLT_EPILOGUE_BIAS)
        fail_with("epilogue " + std::to_string(e) + " (only DEFAULT and BIAS are emulated)");
      if (st == CUBLAS_STATUS_SUCCESS) desc->epilogue = e;
      return st;
    }
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return read_attribute(desc->bias, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return read_attribute(desc->bias_batch_stride, buf, bytes);
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: {
      int32_t t = 0;
      const cublasStatus_t st = read_attribute(t, buf, bytes);
      if (st == CUBLAS_STATUS_SUCCESS && t != -1 && !known_type(t)) return CUBLAS_STATUS_INVALID_VALUE;
      if (st == CUBLAS_STATUS_SUCCESS) desc->bias_type = t;
      return st;
    }
    default: fail_with("matmul descriptor attribute " + std::to_string(int(attr)) + " (not emulated)");
  }
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                                          uint64_t cols, int64_t ld) {
  if (layout == nullptr || !known_type(type)) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque_t;
  (*layout)->type = type, (*layout)->rows = rows, (*layout)->cols = cols, (*layout)->ld = ld;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t bytes) {
  if (layout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
      int32_t n = 0;
      const cublasStatus_t st = read_attribute(n, buf, bytes);
      if (st == CUBLAS_STATUS_SUCCESS && n < 1) return CUBLAS_STATUS_INVALID_VALUE;
      if (st == CUBLAS_STATUS_SUCCESS) layout->batch = n;
      return st;
    }
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: return read_attribute(layout->batch_stride, buf, bytes);
    case CUBLASLT_MATRIX_LAYOUT_ORDER: {
      int32_t order = 0;
      const cublasStatus_t st = read_attribute(order, buf, bytes);
      if (st == CUBLAS_STATUS_SUCCESS && order != CUBLASLT_ORDER_COL)
        fail_with("matrix order " + std::to_string(order) + " (only column-major is emulated)");
      return st;
    }
    default: fail_with("matrix layout attribute " + std::to_string(int(attr)) + " (not emulated)");
  }
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
                                                    size_t bytes) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return read_attribute(pref->max_workspace, buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return read_attribute(pref->align[0], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return read_attribute(pref->align[1], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return read_attribute(pref->align[2], buf, bytes);
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return read_attribute(pref->align[3], buf, bytes);
    default: fail_with("preference attribute " + std::to_string(int(attr)) + " (not emulated)");
  }
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int* returned) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !a || !b || !c || !d || !pref || requested <= 0 || !results || !returned)
    return CUBLAS_STATUS_INVALID_VALUE;
  *returned = 0;
  const Shape s = shape_of(*desc, *a, *b, *c, *d);
  if (s.status != CUBLAS_STATUS_SUCCESS) return s.status;
  if (!supported_types(*desc, *a, *b, *d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  AlgoProblem p{desc->trans_a, desc->trans_b, desc->epilogue, a->type, b->type, c->type, d->type,
                bias_type_of(*desc, *d), {}, size_t(pref->max_workspace)};
  for (int i = 0; i < 4; ++i) p.align[i] = std::min<uint32_t>(pref->align[i], 256);
  p.align[4] = desc->bias ? alignment_of(desc->bias) : 256;  // a null pointer is as aligned as any
  std::lock_guard<std::mutex> lock(g_algos_mutex);
  g_algos.push_back(p);
  results[0] = {};
  results[0].algo.data[0] = g_algos.size();
  results[0].algo.data[1] = kAlgoMagic;
  results[0].workspaceSize = p.workspace;  // an algorithm may use all it was allowed
  results[0].state = CUBLAS_STATUS_SUCCESS;
  results[0].wavesCount = 1.0f;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* A,
                              cublasLtMatrixLayout_t a, const void* B, cublasLtMatrixLayout_t b, const void* beta,
                              const void* C, cublasLtMatrixLayout_t c, void* D, cublasLtMatrixLayout_t d,
                              const cublasLtMatmulAlgo_t* algo, void* workspace, size_t workspace_bytes,
                              CUstream_st*) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!desc || !alpha || !beta || !A || !B || !C || !D || !a || !b || !c || !d) return CUBLAS_STATUS_INVALID_VALUE;
  const Shape s = shape_of(*desc, *a, *b, *c, *d);
  if (s.status != CUBLAS_STATUS_SUCCESS) return s.status;
  if (!supported_types(*desc, *a, *b, *d)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (algo == nullptr) fail_with("a matmul without an algorithm (the emulated library has no default heuristic)");
  AlgoProblem p;
  {
    std::lock_guard<std::mutex> lock(g_algos_mutex);
    if (algo->data[1] != kAlgoMagic || algo->data[0] == 0 || algo->data[0] > g_algos.size())
      fail_with("an algorithm no heuristic returned");
    p = g_algos[algo->data[0] - 1];
  }
  if (p.trans_a != desc->trans_a || p.trans_b != desc->trans_b || p.epilogue != desc->epilogue ||
      p.a_type != a->type || p.b_type != b->type || p.c_type != c->type || p.d_type != d->type ||
      p.bias_type != bias_type_of(*desc, *d))
    fail_with("an algorithm chosen for another operation (types, transposes or epilogue differ)");
  if (workspace_bytes < p.workspace || (p.workspace > 0 && workspace == nullptr))
    fail_with("workspace of " + std::to_string(workspace_bytes) + " bytes; the algorithm asked for " +
              std::to_string(p.workspace));
  check_alignment("A", A, *a, p.align[0]);
  check_alignment("B", B, *b, p.align[1]);
  check_alignment("C", C, *c, p.align[2]);
  check_alignment("D", D, *d, p.align[3]);
  const bool with_bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS;
  if (with_bias && desc->bias == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  if (with_bias && alignment_of(desc->bias) < p.align[4])
    fail_with("the bias is " + std::to_string(alignment_of(desc->bias)) +
              "-byte aligned; the heuristic saw a pointer aligned to " + std::to_string(p.align[4]));
  const uint64_t d_bytes = extent_bytes(*d);
  if (overlap(D, d_bytes, A, extent_bytes(*a)) || overlap(D, d_bytes, B, extent_bytes(*b)))
    fail_with("D overlaps A or B (undefined)");
  if (C == D && (c->ld != d->ld || c->batch_stride != d->batch_stride))
    fail_with("in-place C == D with different layouts (cuBLASLt requires Cdesc to match Ddesc)");
  if (C != D && overlap(D, d_bytes, C, extent_bytes(*c))) fail_with("D partly overlaps C (undefined)");

  emu::DeviceAccess open;  // the matmul reads and writes device memory
  const float alpha_f = *static_cast<const float*>(alpha), beta_f = *static_cast<const float*>(beta);
  const auto bias_t = bias_type_of(*desc, *d);
  const int64_t m = int64_t(s.m), n = int64_t(s.n), k = int64_t(s.k);
  std::vector<float> op_a(size_t(m * k)), op_b_t(size_t(n * k));  // op(A) (m, k), op(B)^T (n, k): row-major
  for (int32_t batch = 0; batch < d->batch; ++batch) {
    const auto at = [batch](const void* p, const cublasLtMatrixLayoutOpaque_t& l) {
      return static_cast<const char*>(p) + uint64_t(batch) * uint64_t(l.batch_stride) * type_bytes(l.type);
    };
    const char *pa = at(A, *a), *pb = at(B, *b), *pc = at(C, *c);
    char* pd = const_cast<char*>(at(D, *d));
    for (int64_t i = 0; i < m; ++i)  // op(A)(i, kk) = A(i, kk) or A(kk, i); X(r, col) at r + col * ld
      for (int64_t kk = 0; kk < k; ++kk)
        op_a[size_t(i * k + kk)] =
            load(pa, a->type, transposed(desc->trans_a) ? kk + i * a->ld : i + kk * a->ld);
    for (int64_t j = 0; j < n; ++j)  // op(B)(kk, j) = B(kk, j) or B(j, kk)
      for (int64_t kk = 0; kk < k; ++kk)
        op_b_t[size_t(j * k + kk)] =
            load(pb, b->type, transposed(desc->trans_b) ? j + kk * b->ld : kk + j * b->ld);
    const char* bias = with_bias ? static_cast<const char*>(desc->bias) +
                                       uint64_t(batch) * uint64_t(desc->bias_batch_stride) * type_bytes(bias_t)
                                 : nullptr;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        const float* x = &op_a[size_t(i * k)];
        const float* y = &op_b_t[size_t(j * k)];
        float acc = 0.0f;
        for (int64_t kk = 0; kk < k; ++kk) acc += x[kk] * y[kk];
        float v = alpha_f * acc;
        if (beta_f != 0.0f) v += beta_f * load(pc, c->type, i + j * c->ld);
        if (bias) v += load(bias, bias_t, i);
        store(pd, d->type, i + j * d->ld, v);
      }
  }
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid value was used as an argument (emulated cuBLASLt)";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported (emulated cuBLASLt)";
    default: return "emulated cuBLASLt";
  }
}
