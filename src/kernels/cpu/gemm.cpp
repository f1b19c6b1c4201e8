// GEMM through oneDNN's matmul primitive, primitives cached by everything that shapes them.
// alpha is an output scale, beta a "sum" post-op; transposes are strides in the memory descriptors.
// Tiny products (below kTinyFlops) skip oneDNN: its per-call overhead would dominate them.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>
#include <omp.h>

#include "core/error.h"
#include "core/parallel.h"

namespace ktune::cpu {
namespace {

using dnnl::memory;

struct GemmKey {
  bool trans_a, trans_b, bf16;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  bool operator==(const GemmKey& o) const {
    return std::tie(trans_a, trans_b, bf16, M, N, K, lda, ldb, ldc, alpha, beta) ==
           std::tie(o.trans_a, o.trans_b, o.bf16, o.M, o.N, o.K, o.lda, o.ldb, o.ldc, o.alpha, o.beta);
  }
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = std::hash<int64_t>()(k.M);
    auto mix = [&h](size_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    for (int64_t v : {k.N, k.K, k.lda, k.ldb, k.ldc}) mix(std::hash<int64_t>()(v));
    mix(std::hash<float>()(k.alpha));
    mix(std::hash<float>()(k.beta));
    mix(size_t(k.trans_a) | size_t(k.trans_b) << 1 | size_t(k.bf16) << 2);
    return h;
  }
};

// A cached product: the primitive (shared by every thread that multiplies this shape) and the size
// of the scratchpad it needs. Primitives are created with a user-managed scratchpad, which the
// calling thread supplies: with the library's (the default), every primitive of a oneDNN built
// without DNNL_ENABLE_CONCURRENT_EXEC shares one scratchpad and may only run on the thread that
// created it, and two threads running cached products at once (in-process ranks, callers inside a
// parallel region) corrupted each other's results on AVX-512 machines.
struct CachedMatmul {
  std::shared_ptr<dnnl::matmul> primitive;  // null for a bf16 shape oneDNN cannot do here
  memory::desc scratchpad;
};

struct Cache {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::unordered_map<GemmKey, CachedMatmul, GemmKeyHash> primitives;
};

Cache& cache() {
  static Cache c;
  return c;
}

// The product's primitive, created on first use. A cache that grows past kMaxPrimitives (callers
// with ever-changing alphas) is cleared rather than left to grow.
CachedMatmul primitive_for(const GemmKey& key) {
  constexpr size_t kMaxPrimitives = 4096;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto it = c.primitives.find(key);
  if (it != c.primitives.end()) return it->second;  // (null for a bf16 shape oneDNN cannot do here)
  if (c.primitives.size() >= kMaxPrimitives) c.primitives.clear();
  memory::data_type in_type = key.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  // Logical A (M,K): row-major (lda, 1), or column-major (1, lda) when stored (K,M).
  memory::desc a_md({key.M, key.K}, in_type, key.trans_a ? memory::dims{1, key.lda} : memory::dims{key.lda, 1});
  memory::desc b_md({key.K, key.N}, in_type, key.trans_b ? memory::dims{1, key.ldb} : memory::dims{key.ldb, 1});
  memory::desc c_md({key.M, key.N}, memory::data_type::f32, memory::dims{key.ldc, 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(key.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc(a_md, b_md, c_md);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(desc, attr, c.engine);
  } catch (const dnnl::error& e) {
    if (key.bf16) {  // no bf16 kernels on this CPU (AVX2-only): the caller widens to f32
      c.primitives.emplace(key, CachedMatmul{});
      return CachedMatmul{};
    }
    throw Error("gemm", std::string("oneDNN has no matmul for this shape/type: ") + e.what());
  }
  CachedMatmul made{std::make_shared<dnnl::matmul>(pd), pd.scratchpad_desc()};
  c.primitives.emplace(key, made);
  return made;
}

// Without bf16 kernels in oneDNN (CPUs without AVX-512), bf16 operands are widened to f32 in
// thread-local buffers (dense, same orientation) and multiplied by the f32 primitive.
void widen(std::vector<float>& dst, const bf16_t* src, int64_t rows, int64_t cols, int64_t ld) {
  dst.resize(size_t(rows * cols));
  float* d = dst.data();
  parallel_for(rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = bf16_to_f32(src[r * ld + c]);
  }, 64);
}

// Products this small run as plain loops (oneDNN's call overhead is a few microseconds).
constexpr double kTinyFlops = 2.0 * 16 * 16 * 16;
// Products below this many FLOPs (~30 us on one core) run single-threaded.
constexpr double kSingleThreadFlops = double(1 << 20);

template <typename In>
float load(const In* p);
template <>
float load<float>(const float* p) { return *p; }
template <>
float load<bf16_t>(const bf16_t* p) { return bf16_to_f32(*p); }

// C = alpha op(A) op(B) + beta C with strides; Acc is the accumulator type.
template <typename Acc, typename In>
void gemm_loops(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda,
                const In* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      Acc acc = 0;
      for (int64_t p = 0; p < K; ++p) {
        Acc a = load(trans_a ? A + p * lda + i : A + i * lda + p);
        Acc b = load(trans_b ? B + j * ldb + p : B + p * ldb + j);
        acc += a * b;
      }
      float prior = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
      C[i * ldc + j] = float(Acc(alpha) * acc + Acc(prior));
    }
  }
}

void check_shape(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                 int64_t ldc) {
  check(M >= 0 && N >= 0 && K >= 0, "gemm", "negative size");
  check(lda >= (trans_a ? M : K) && ldb >= (trans_b ? K : N) && ldc >= N, "gemm",
        "leading dimension smaller than the row it strides over");
}

template <typename In>
void gemm_dispatch(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const In* A,
                   int64_t lda, const In* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  check_shape(trans_a, trans_b, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0 || alpha == 0.0f) {  // C = beta C
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return;
  }
  if (2.0 * double(M) * double(N) * double(K) <= kTinyFlops) {
    gemm_loops<float>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  GemmKey key{trans_a, trans_b, std::is_same_v<In, bf16_t>, M, N, K, lda, ldb, ldc, alpha, beta};
  const CachedMatmul cached = primitive_for(key);
  if (!cached.primitive) {
    if constexpr (std::is_same_v<In, bf16_t>) {
      thread_local std::vector<float> a32, b32;
      widen(a32, A, trans_a ? K : M, trans_a ? M : K, lda);
      widen(b32, B, trans_b ? N : K, trans_b ? K : N, ldb);
      gemm_dispatch<float>(trans_a, trans_b, M, N, K, alpha, a32.data(), trans_a ? M : K, b32.data(),
                           trans_b ? K : N, beta, C, ldc);
      return;
    }
  }
  Cache& c = cache();
  thread_local dnnl::stream stream(c.engine);
  memory::data_type in_type = key.bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory::desc a_md({M, K}, in_type, trans_a ? memory::dims{1, lda} : memory::dims{lda, 1});
  memory::desc b_md({K, N}, in_type, trans_b ? memory::dims{1, ldb} : memory::dims{ldb, 1});
  memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  memory a_mem(a_md, c.engine, const_cast<In*>(A));
  memory b_mem(b_md, c.engine, const_cast<In*>(B));
  memory c_mem(c_md, c.engine, C);
  // Small products run on the calling thread: waking the team costs more than it saves, and on a
  // loaded machine a tiny parallel region can wait a whole scheduler slice for its second thread.
  struct SingleThreadScope {  // restores the thread count even if execute throws
    int saved = 0;
    explicit SingleThreadScope(bool single) : saved(single ? omp_get_max_threads() : 0) {
      if (saved > 1) omp_set_num_threads(1);
    }
    ~SingleThreadScope() {
      if (saved > 1) omp_set_num_threads(saved);
    }
  } scope(2.0 * double(M) * double(N) * double(K) < kSingleThreadFlops);
  thread_local std::vector<uint8_t> scratch;  // this thread's scratchpad, grown to the largest asked for
  scratch.resize(std::max(scratch.size(), cached.scratchpad.get_size()));
  memory scratch_mem(cached.scratchpad, c.engine, scratch.data());
  cached.primitive->execute(
      stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}, {DNNL_ARG_SCRATCHPAD, scratch_mem}});
  stream.wait();
}

}  // namespace

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  gemm_dispatch(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16_t* A,
               const bf16_t* B, float beta, float* C) {
  gemm_dispatch(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void gemm_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  gemm_dispatch(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_bf16_strided(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16_t* A, int64_t lda, const bf16_t* B, int64_t ldb, float beta, float* C,
                       int64_t ldc) {
  gemm_dispatch(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                    const float* B, float beta, float* C) {
  gemm_loops<double>(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

void gemm_bf16_reference(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                         const bf16_t* A, const bf16_t* B, float beta, float* C) {
  gemm_loops<double>(trans_a, trans_b, M, N, K, alpha, A, trans_a ? M : K, B, trans_b ? K : N, beta, C, N);
}

bool gemm_bf16_native() {
  static const bool native = [] {
    GemmKey key{false, false, true, 32, 32, 32, 32, 32, 32, 1.0f, 0.0f};
    return primitive_for(key).primitive != nullptr;
  }();
  return native;
}

bool bf16_weights_use_bf16_gemm() {
  const char* env = std::getenv("KTUNE_BF16_GEMM");
  const std::string mode = env ? env : "";
  if (mode == "widen") return false;
  if (mode == "bf16") return true;
  if (!mode.empty()) throw Error("KTUNE_BF16_GEMM", "expected widen or bf16, got '" + mode + "'");
  return gemm_bf16_native();
}

int64_t gemm_cached_primitives() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return int64_t(c.primitives.size());
}

namespace {

template <typename In>
double measure(int64_t M, int64_t N, int64_t K, double seconds) {
  std::vector<In> a(size_t(M * K)), b(size_t(K * N));
  std::vector<float> c(size_t(M * N));
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (auto& x : a) x = In(0);
  for (size_t i = 0; i < a.size(); ++i) {
    float v = dist(rng);
    if constexpr (std::is_same_v<In, float>) a[i] = v; else a[i] = f32_to_bf16(v);
  }
  for (size_t i = 0; i < b.size(); ++i) {
    float v = dist(rng);
    if constexpr (std::is_same_v<In, float>) b[i] = v; else b[i] = f32_to_bf16(v);
  }
  auto run = [&] { gemm_dispatch<In>(false, false, M, N, K, 1.0f, a.data(), K, b.data(), N, 0.0f, c.data(), N); };
  run();  // creates the primitive, faults the pages in
  using clock = std::chrono::steady_clock;
  auto start = clock::now();
  int64_t iterations = 0;
  double elapsed = 0;
  do {
    run();
    ++iterations;
    elapsed = std::chrono::duration<double>(clock::now() - start).count();
  } while (elapsed < seconds);
  return 2.0 * double(M) * double(N) * double(K) * double(iterations) / elapsed / 1e9;
}

}  // namespace

double measure_gemm_gflops(int64_t M, int64_t N, int64_t K, double seconds) {
  return measure<float>(M, N, K, seconds);
}

double measure_gemm_bf16_gflops(int64_t M, int64_t N, int64_t K, double seconds) {
  return measure<bf16_t>(M, N, K, seconds);
}

}  // namespace ktune::cpu
