// The emulated cuBLASLt (cublaslt_on_host.cpp) against cuBLASLt's documented contract, called
// directly in its own column-major terms — not through gemm.cu, whose mapping gemm_test.cpp checks
// on top of it. The expected values come from loops written from cublasLt.h's definitions:
// D = alpha op(A) op(B) + beta C + bias, element (i, j) of a column-major layout at i + j ld, the
// b-th product of a strided batch at b * STRIDED_BATCH_OFFSET elements, the bias a vector over D's
// rows. Then what the library refuses (statuses) and what the emulator ends the run for (undefined
// on a GPU: pointers less aligned than the heuristic was told, an algorithm of another operation, a
// short workspace, D over A), each in a child process whose message is checked.
#include <sys/wait.h>
#include <unistd.h>

#include <cublasLt.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "cuda_test_harness.h"

namespace ktune {
namespace {

using cuda_test::random_floats;
using cuda_test::to_device;

// One column-major matrix on the device: (rows, cols) with leading dimension ld, `batch` of them
// `stride` elements apart, bf16 or f32; `host` keeps the f32 values it holds.
struct Matrix {
  cudaDataType_t type;
  int64_t rows, cols, ld, batch, stride;
  std::vector<float> host;
  cuda::DeviceBuffer device;
  float at(int64_t b, int64_t i, int64_t j) const { return host[size_t(b * stride + i + j * ld)]; }
};

Matrix make_matrix(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch, uint32_t seed) {
  const int64_t stride = ld * cols + 8;  // a gap between products
  Matrix m{type, rows, cols, ld, batch, stride, random_floats(size_t(batch * stride), seed), {}};
  if (type == CUDA_R_16BF) {
    m.host = cuda_test::rounded_to_bf16(m.host);
    m.device = to_device(cuda_test::to_bf16(m.host));
  } else {
    m.device = to_device(m.host);
  }
  return m;
}

std::vector<float> downloaded(const Matrix& m) {
  const size_t n = m.host.size();
  return m.type == CUDA_R_32F ? cuda_test::from_device<float>(m.device, n)
                              : cuda_test::from_bf16(cuda_test::from_device<bf16_t>(m.device, n));
}

// The handles of one matmul, destroyed together.
struct Lt {
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Lt() {
    cublasLtCreate(&handle);
    cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
    cublasLtMatmulPreferenceCreate(&pref);
  }
  ~Lt() {
    cublasLtMatrixLayoutDestroy(a);
    cublasLtMatrixLayoutDestroy(b);
    cublasLtMatrixLayoutDestroy(c);
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatmulDescDestroy(desc);
    cublasLtDestroy(handle);
  }
  void ops(cublasOperation_t ta, cublasOperation_t tb) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  }
  static cublasLtMatrixLayout_t layout(const Matrix& m) {
    cublasLtMatrixLayout_t l = nullptr;
    cublasLtMatrixLayoutCreate(&l, m.type, uint64_t(m.rows), uint64_t(m.cols), m.ld);
    if (m.batch > 1) {
      const int32_t count = int32_t(m.batch);
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof m.stride);
    }
    return l;
  }
  void layouts(const Matrix& A, const Matrix& B, const Matrix& C) { a = layout(A), b = layout(B), c = layout(C); }
  cublasStatus_t heuristic(cublasLtMatmulHeuristicResult_t& r) {
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, 1, &r, &found);
    return st == CUBLAS_STATUS_SUCCESS && found == 0 ? CUBLAS_STATUS_NOT_SUPPORTED : st;
  }
  cublasStatus_t matmul(const cublasLtMatmulHeuristicResult_t& r, float alpha, const void* A, const void* B, float beta,
                        void* C, void* workspace, size_t workspace_bytes) {
    return cublasLtMatmul(handle, desc, &alpha, A, a, B, b, &beta, C, c, C, c, &r.algo, workspace, workspace_bytes,
                          nullptr);
  }
};

// D = alpha op(A) op(B) + beta C + bias over every product, in double, from the definitions.
std::vector<float> expected(bool ta, bool tb, float alpha, const Matrix& A, const Matrix& B, float beta,
                            const Matrix& C, const std::vector<float>* bias) {
  std::vector<float> want = C.host;
  const int64_t m = C.rows, n = C.cols, k = ta ? A.rows : A.cols;
  for (int64_t b = 0; b < C.batch; ++b)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          acc += double(ta ? A.at(b, kk, i) : A.at(b, i, kk)) * double(tb ? B.at(b, j, kk) : B.at(b, kk, j));
        double v = alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * C.at(b, i, j));
        if (bias) v += (*bias)[size_t(i)];
        want[size_t(b * C.stride + i + j * C.ld)] = float(v);
      }
  return want;
}

void check_product(bool ta, bool tb, cudaDataType_t in, cudaDataType_t out, int64_t batch, float beta, bool with_bias) {
  const int64_t m = 19, n = 23, k = 37;
  Matrix A = make_matrix(in, ta ? k : m, ta ? m : k, (ta ? k : m) + 3, batch, 1);
  Matrix B = make_matrix(in, tb ? n : k, tb ? k : n, (tb ? n : k) + 5, batch, 2);
  Matrix C = make_matrix(out, m, n, m + 2, batch, 3);
  std::vector<float> bias = random_floats(size_t(m), 4);
  if (out == CUDA_R_16BF) bias = cuda_test::rounded_to_bf16(bias);
  cuda::DeviceBuffer bias_device = out == CUDA_R_32F ? to_device(bias) : to_device(cuda_test::to_bf16(bias));
  cuda::DeviceBuffer workspace(1 << 20);
  Lt lt;
  lt.ops(ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N);
  if (with_bias) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    const void* p = bias_device.data();
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p);
  }
  lt.layouts(A, B, C);
  const uint64_t ws = 1 << 20;
  cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  const uint32_t element_aligned = 2;  // the products of a batch sit at odd element offsets (the gaps)
  for (auto attribute : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                         CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    cublasLtMatmulPreferenceSetAttribute(lt.pref, attribute, &element_aligned, sizeof element_aligned);
  cublasLtMatmulHeuristicResult_t r{};
  CHECK(lt.heuristic(r) == CUBLAS_STATUS_SUCCESS);
  const float alpha = 0.75f;
  const std::vector<float> want = expected(ta, tb, alpha, A, B, beta, C, with_bias ? &bias : nullptr);
  CHECK(lt.matmul(r, alpha, A.device.data(), B.device.data(), beta, C.device.data(), workspace.data(), ws) ==
        CUBLAS_STATUS_SUCCESS);
  const std::vector<float> got = downloaded(C);
  // Gaps and pads between the products are compared too: they must keep C's values.
  CHECK_CLOSE(got.data(), want.data(), int64_t(got.size()), 1e-4, out == CUDA_R_32F ? 1e-4 : 8e-3)
      << "ta=" << ta << " tb=" << tb << " out=" << (out == CUDA_R_32F ? "f32" : "bf16") << " batch=" << batch
      << " beta=" << beta << " bias=" << with_bias;
}

KTUNE_CUDA_TEST(CublasLtEmulationComputesTheDocumentedProduct) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_product(ta, tb, CUDA_R_16BF, CUDA_R_32F, 1, 0.0f, false);
      check_product(ta, tb, CUDA_R_16BF, CUDA_R_16BF, 1, 0.5f, true);
      check_product(ta, tb, CUDA_R_16BF, CUDA_R_32F, 3, 1.0f, false);
      check_product(ta, tb, CUDA_R_32F, CUDA_R_32F, 2, 0.0f, true);
    }
}

// A heuristic's status for A (am, ak) op ta, B (bk, bn) op tb into D (m, n), with these types.
cublasStatus_t heuristic_status(uint64_t am, uint64_t ak, uint64_t bk, uint64_t bn, uint64_t m, uint64_t n,
                                cudaDataType_t in, cudaDataType_t out, int64_t ld_d, int32_t batch_b = 1,
                                int32_t bias_type = -2) {
  Lt lt;
  cublasLtMatrixLayoutCreate(&lt.a, in, am, ak, int64_t(am));
  cublasLtMatrixLayoutCreate(&lt.b, in, bk, bn, int64_t(bk));
  cublasLtMatrixLayoutCreate(&lt.c, out, m, n, ld_d);
  if (batch_b != 1) cublasLtMatrixLayoutSetAttribute(lt.b, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch_b, sizeof batch_b);
  if (bias_type != -2) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  }
  cublasLtMatmulHeuristicResult_t r{};
  return lt.heuristic(r);
}

KTUNE_CUDA_TEST(CublasLtEmulationRefusesWhatTheLibraryRefuses) {
  // (8, 4) @ (4, 6) -> (8, 6) fits; each change below breaks one rule.
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_32F, 8) == CUBLAS_STATUS_SUCCESS);
  CHECK(heuristic_status(8, 4, 5, 6, 8, 6, CUDA_R_16BF, CUDA_R_32F, 8) == CUBLAS_STATUS_INVALID_VALUE);  // k
  CHECK(heuristic_status(8, 4, 4, 6, 8, 7, CUDA_R_16BF, CUDA_R_32F, 8) == CUBLAS_STATUS_INVALID_VALUE);  // n
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_32F, 7) == CUBLAS_STATUS_INVALID_VALUE);  // ld < rows
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_32F, 8, 2) == CUBLAS_STATUS_INVALID_VALUE);  // batch
  // No CUBLAS_COMPUTE_32F kernel for f32 inputs with a bf16 D, or a bias of another type than D's.
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_32F, CUDA_R_16BF, 8) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_16BF, 8, 1, CUDA_R_16BF) == CUBLAS_STATUS_SUCCESS);
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_16BF, 8, 1, CUDA_R_32F) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(heuristic_status(8, 4, 4, 6, 8, 6, CUDA_R_16BF, CUDA_R_16BF, 8, 1, -1) == CUBLAS_STATUS_SUCCESS);  // D's
  // An attribute of the wrong size ("doesn't match size of internal storage").
  Lt lt;
  const int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const uint32_t narrow = 1 << 20;
  CHECK(cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &narrow,
                                             sizeof narrow) == CUBLAS_STATUS_INVALID_VALUE);
}

// Runs fn in a child process; the child's stderr, and whether it ended by a signal (emu::fail aborts).
struct Ending {
  bool died = false;
  std::string stderr_text;
};
Ending run_in_child(const std::function<void()>& fn) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    fn();
    _exit(0);
  }
  close(fds[1]);
  Ending e;
  char buf[512];
  for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) e.stderr_text.append(buf, size_t(got));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  e.died = WIFSIGNALED(status);
  return e;
}

// A bf16 (16, 16) @ (16, 16) -> f32 matmul whose heuristic is told A's alignment and (with_bias)
// sees the bias pointer `bias_at_heuristic` (null: not yet set), then runs on A + a_offset bytes with
// the bias at `bias_at_matmul`, the workspace given and D of type run_out.
void aligned_matmul(size_t a_offset, uint32_t a_alignment, bool with_bias, const void* bias_at_heuristic,
                    const void* bias_at_matmul, size_t workspace_bytes, cudaDataType_t run_out = CUDA_R_32F) {
  cuda::DeviceBuffer A(4096), B(4096), C(4096), workspace(1 << 16);
  A.zero(), B.zero(), C.zero();
  Lt lt;
  cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_16BF, 16, 16, 16);
  cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_16BF, 16, 16, 16);
  cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, 16, 16, 16);
  if (with_bias) {
    cublasLtEpilogue_t e = CUBLASLT_EPILOGUE_BIAS;
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e);
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_at_heuristic,
                                   sizeof bias_at_heuristic);
  }
  const uint64_t ws = 1 << 16;
  cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  cublasLtMatmulPreferenceSetAttribute(lt.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a_alignment,
                                       sizeof a_alignment);
  cublasLtMatmulHeuristicResult_t r{};
  if (lt.heuristic(r) != CUBLAS_STATUS_SUCCESS) return;
  if (with_bias)
    cublasLtMatmulDescSetAttribute(lt.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_at_matmul, sizeof bias_at_matmul);
  if (run_out != CUDA_R_32F) {  // the same algorithm on a bf16 D
    cublasLtMatrixLayoutDestroy(lt.c);
    cublasLtMatrixLayoutCreate(&lt.c, run_out, 16, 16, 16);
  }
  lt.matmul(r, 1.0f, static_cast<char*>(A.data()) + a_offset, B.data(), 0.0f, C.data(), workspace.data(),
            workspace_bytes);
}

KTUNE_CUDA_TEST(CublasLtEmulationStopsWhatIsUndefinedOnAGpu) {
  cuda::DeviceBuffer bias(1024);  // 16 f32 read at up to 256 bytes in
  const char* aligned = static_cast<const char*>(bias.data());
  // Controls: told the truth, nothing stops them.
  Ending ok = run_in_child([&] { aligned_matmul(2, 2, true, aligned + 4, aligned + 4, 1 << 16); });
  CHECK(!ok.died) << ok.stderr_text;
  ok = run_in_child([&] { aligned_matmul(0, 256, true, aligned, aligned + 256, 1 << 16); });
  CHECK(!ok.died) << ok.stderr_text;
  struct Case {
    const char* what;
    std::function<void()> fn;
    const char* says;
  };
  const Case cases[] = {
      {"A 2-byte aligned, the preference's default 256",
       [&] { aligned_matmul(2, 256, false, nullptr, nullptr, 1 << 16); }, "matrix A of product 0 is 2-byte aligned"},
      {"bias 4-byte aligned, the heuristic saw it 256-byte aligned",
       [&] { aligned_matmul(0, 256, true, aligned, aligned + 4, 1 << 16); }, "the bias is 4-byte aligned"},
      {"bias pointer set only after the heuristic (it assumed any alignment)",
       [&] { aligned_matmul(0, 256, true, nullptr, aligned + 4, 1 << 16); }, "the bias is 4-byte aligned"},
      {"workspace short of what the algorithm asked",
       [&] { aligned_matmul(0, 256, false, nullptr, nullptr, 1 << 10); }, "workspace of 1024 bytes"},
      {"an f32-D algorithm run on a bf16 D",
       [&] { aligned_matmul(0, 256, false, nullptr, nullptr, 1 << 16, CUDA_R_16BF); }, "chosen for another operation"},
  };
  for (const Case& c : cases) {
    const Ending e = run_in_child(c.fn);
    CHECK(e.died && e.stderr_text.find(c.says) != std::string::npos) << c.what << ": " << e.stderr_text;
  }
  // D overlapping A: one buffer for both.
  const Ending overlap = run_in_child([] {
    cuda::DeviceBuffer X(8192), workspace(1 << 16);
    X.zero();
    Lt lt;
    cublasLtMatrixLayoutCreate(&lt.a, CUDA_R_32F, 16, 16, 16);
    cublasLtMatrixLayoutCreate(&lt.b, CUDA_R_32F, 16, 16, 16);
    cublasLtMatrixLayoutCreate(&lt.c, CUDA_R_32F, 16, 16, 16);
    cublasLtMatmulHeuristicResult_t r{};
    if (lt.heuristic(r) != CUBLAS_STATUS_SUCCESS) return;
    char* base = static_cast<char*>(X.data());
    lt.matmul(r, 1.0f, base, base + 2048, 0.0f, base + 512, workspace.data(), 0);
  });
  CHECK(overlap.died && overlap.stderr_text.find("D overlaps A or B") != std::string::npos) << overlap.stderr_text;
}

}  // namespace
}  // namespace ktune
