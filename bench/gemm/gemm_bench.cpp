// ktune_bench_gemm [--quick] [--json FILE]: measures, in one run,
//  - gemm() f32 and gemm_bf16() GFLOP/s on training shapes (M = tokens 256..1024, K, N = 768..32000),
//  - attention forward+backward and fused linear+cross-entropy forward+backward (ms and GFLOP/s),
//  - the glue ops (RMSNorm, SwiGLU, RoPE, AdamW) in GB/s of the memory they must touch,
// and prints them (and writes JSON for torch_ops.py, which measures PyTorch on the same shapes and
// prints the ratios). Threads: KTUNE_NUM_THREADS / OMP_NUM_THREADS, else all cores.
// Times are the best of several repetitions (the machines are shared and noisy). With --cpu-time
// they are the process's CPU time instead of wall time: with KTUNE_NUM_THREADS=1 that is a per-core
// figure a loaded machine cannot inflate by descheduling us (torch_ops.py then does the same).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"

using namespace ktune;
using namespace ktune::cpu;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

bool g_cpu_time = false;

double now() {
  if (g_cpu_time) {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best time of fn over `reps` runs after one warm-up (seconds).
double best_time(const std::function<void()>& fn, int reps) {
  fn();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    double t0 = now();
    fn();
    best = std::min(best, now() - t0);
  }
  return best;
}

// GFLOP/s of gemm (f32 or bf16 inputs) on x (M,K) @ W^T, W (N,K): measure_gemm_gflops's figure, or
// with --cpu-time the best of short CPU-timed batches.
double gemm_rate(int64_t M, int64_t K, int64_t N, bool bf16, double seconds) {
  if (!g_cpu_time) return bf16 ? measure_gemm_bf16_gflops(M, N, K, seconds) : measure_gemm_gflops(M, N, K, seconds);
  auto a = random_floats(size_t(M * K), 1), b = random_floats(size_t(N * K), 2);
  std::vector<float> c(size_t(M * N));
  std::vector<bf16_t> a16(a.size()), b16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = f32_to_bf16(a[i]);
  for (size_t i = 0; i < b.size(); ++i) b16[i] = f32_to_bf16(b[i]);
  auto run = [&] {
    if (bf16) gemm_bf16(false, true, M, N, K, 1.0f, a16.data(), b16.data(), 0.0f, c.data());
    else gemm(false, true, M, N, K, 1.0f, a.data(), b.data(), 0.0f, c.data());
  };
  double t = best_time(run, std::max(3, int(seconds * 20)));
  return 2.0 * double(M) * double(N) * double(K) / t / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--cpu-time")) g_cpu_time = true;
    else if (!std::strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
  }
  const double seconds = quick ? 0.15 : 0.4;
  const int reps = quick ? 3 : 5;
  nlohmann::json report;
  report["threads"] = num_threads();
  report["bf16_native"] = gemm_bf16_native();
  report["cpu_time"] = g_cpu_time;
  std::printf("ktune kernels benchmark: %d threads, oneDNN bf16 %s, %s time\n", num_threads(),
              gemm_bf16_native() ? "native" : "NOT native on this CPU (widened to f32)",
              g_cpu_time ? "process CPU" : "wall");

  // --- GEMM: (M tokens, K in, N out) as the forward of a linear layer computes it, x (M,K) @ W^T.
  const std::vector<std::array<int64_t, 3>> shapes = {
      {256, 768, 768}, {256, 768, 3072}, {256, 3072, 768}, {512, 768, 2304},
      {1024, 768, 768}, {1024, 768, 3072}, {1024, 3072, 768}, {512, 768, 32000}, {1024, 2048, 8192}};
  std::printf("\n%-22s %12s %12s\n", "gemm M x K x N", "f32 GFLOP/s", "bf16 GFLOP/s");
  double best_f32 = 0;
  for (auto [M, K, N] : shapes) {
    double f32 = gemm_rate(M, K, N, false, seconds);
    double bf16 = gemm_rate(M, K, N, true, seconds * 0.5);
    best_f32 = std::max(best_f32, f32);
    char name[64];
    std::snprintf(name, sizeof name, "%lldx%lldx%lld", (long long)M, (long long)K, (long long)N);
    std::printf("%-22s %12.1f %12.1f\n", name, f32, bf16);
    report["gemm"].push_back({{"M", M}, {"K", K}, {"N", N}, {"f32_gflops", f32}, {"bf16_gflops", bf16}});
  }
  report["gemm_ceiling_gflops"] = best_f32;

  // --- Attention forward + backward (causal), Llama-like heads.
  struct AttnCase { const char* name; AttentionShape s; };
  const std::vector<AttnCase> attn_cases = {
      {"B4 T256 H12/12 D64", {4, 256, 12, 12, 64, 0.125f}},
      {"B1 T1024 H12/4 D64", {1, 1024, 12, 4, 64, 0.125f}},
      {"B1 T1024 H8/4 D64 window256 cap50", {1, 1024, 8, 4, 64, 0.125f, 256, 50.0f}},
  };
  std::printf("\n%-36s %10s %10s %12s\n", "attention fwd+bwd", "fwd ms", "bwd ms", "GFLOP/s");
  for (const auto& c : attn_cases) {
    const auto& s = c.s;
    const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
    auto q = random_floats(nq, 1), k = random_floats(nkv, 2), v = random_floats(nkv, 3), dout = random_floats(nq, 4);
    std::vector<float> out(nq), lse(size_t(s.B * s.Hq * s.T)), dq(nq), dk(nkv), dv(nkv);
    double fwd = best_time([&] { attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, s); }, reps);
    double bwd = best_time([&] {
      attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(),
                         lse.data(), nullptr, s);
    }, reps);
    // Useful FLOPs (causal half; window caps the keys): fwd 2 GEMMs, bwd 5 (incl. the recomputed S).
    double pairs = 0;
    for (int64_t i = 0; i < s.T; ++i) pairs += double(s.sliding_window > 0 ? std::min<int64_t>(i + 1, s.sliding_window) : i + 1);
    double flops = 2.0 * s.B * s.Hq * pairs * s.D * (2 + 4);  // fwd QK,PV + bwd dV,dP,dQ,dK (S recompute not counted)
    std::printf("%-36s %10.2f %10.2f %12.1f\n", c.name, fwd * 1e3, bwd * 1e3, flops / (fwd + bwd) / 1e9);
    report["attention"].push_back({{"name", c.name}, {"B", s.B}, {"T", s.T}, {"Hq", s.Hq}, {"Hkv", s.Hkv}, {"D", s.D},
                                   {"window", s.sliding_window}, {"softcap", s.softcap}, {"fwd_ms", fwd * 1e3},
                                   {"bwd_ms", bwd * 1e3}, {"gflops", flops / (fwd + bwd) / 1e9}});
  }

  // --- Fused output projection + cross-entropy, forward + backward (dhidden and dweight).
  struct CeCase { int64_t N, C, V, chunk; };
  const std::vector<CeCase> ce_cases = quick ? std::vector<CeCase>{{512, 768, 32000, 256}, {128, 896, 151936, 128}}
                                             : std::vector<CeCase>{{1024, 768, 32000, 256}, {256, 896, 151936, 128}};
  std::printf("\n%-36s %10s %12s %14s\n", "linear+CE fwd+bwd (N, C, V, chunk)", "ms", "GFLOP/s", "scratch MB");
  for (const auto& c : ce_cases) {
    auto hidden = random_floats(size_t(c.N * c.C), 5), weight = random_floats(size_t(c.V * c.C), 6, 0.05f);
    std::vector<int32_t> labels(static_cast<size_t>(c.N));
    for (int64_t i = 0; i < c.N; ++i) labels[size_t(i)] = int32_t((i * 7919) % c.V);
    std::vector<float> dh(size_t(c.N * c.C)), dw(size_t(c.V * c.C), 0.0f);
    std::vector<float> scratch(linear_cross_entropy_scratch_floats(c.chunk, c.V, c.C));
    double t = best_time([&] {
      linear_cross_entropy(dh.data(), dw.data(), nullptr, hidden.data(), weight.data(), labels.data(), c.N, c.C, c.V,
                           0.0f, 1.0f / float(c.N), c.chunk, scratch.data());
    }, quick ? 2 : 3);
    double flops = 6.0 * c.N * c.C * c.V;
    char name[80];
    std::snprintf(name, sizeof name, "%lld, %lld, %lld, %lld", (long long)c.N, (long long)c.C, (long long)c.V, (long long)c.chunk);
    std::printf("%-36s %10.1f %12.1f %14.1f\n", name, t * 1e3, flops / t / 1e9, scratch.size() * 4.0 / 1e6);
    report["cross_entropy"].push_back({{"N", c.N}, {"C", c.C}, {"V", c.V}, {"chunk", c.chunk}, {"ms", t * 1e3},
                                       {"gflops", flops / t / 1e9}});
  }

  // --- Glue: bytes each op must read + write, over the time it takes.
  const int64_t N = 1024, C = 768, I = 3072, H = 12, D = 64;
  std::printf("\n%-36s %10s %10s\n", "glue op (N=1024, C=768, I=3072)", "ms", "GB/s");
  auto glue = [&](const char* name, double bytes, const std::function<void()>& fn) {
    double t = best_time(fn, reps * 2);
    std::printf("%-36s %10.3f %10.1f\n", name, t * 1e3, bytes / t / 1e9);
    report["glue"].push_back({{"name", name}, {"ms", t * 1e3}, {"gbps", bytes / t / 1e9}});
  };
  {
    auto x = random_floats(size_t(N * C), 7), w = random_floats(size_t(C), 8), dy = random_floats(size_t(N * C), 9);
    std::vector<float> y(size_t(N * C)), rstd(static_cast<size_t>(N)), dx(size_t(N * C)), dw(static_cast<size_t>(C));
    glue("rmsnorm forward", 8.0 * N * C, [&] { rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, 0.0f); });
    glue("rmsnorm backward", 12.0 * N * C, [&] {
      rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C, 0.0f);
    });
    auto g = random_floats(size_t(N * I), 10, 4.0f), u = random_floats(size_t(N * I), 11), d = random_floats(size_t(N * I), 12);
    std::vector<float> o(size_t(N * I)), dg(size_t(N * I)), du(size_t(N * I));
    glue("swiglu forward", 12.0 * N * I, [&] { swiglu_forward(o.data(), g.data(), u.data(), N * I); });
    glue("swiglu backward", 20.0 * N * I, [&] { swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), N * I); });
    glue("geglu_tanh forward", 12.0 * N * I, [&] { geglu_tanh_forward(o.data(), g.data(), u.data(), N * I); });
    glue("geglu_tanh backward", 20.0 * N * I, [&] {
      geglu_tanh_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), N * I);
    });
    RopeTable table(D, 500000.0f, RopeScaling{}, 4096);
    std::vector<int32_t> pos(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) pos[size_t(i)] = int32_t(i % 256);
    auto qr = random_floats(size_t(N * H * D), 13);
    glue("rope forward (12 heads)", 8.0 * N * H * D, [&] { rope_forward(qr.data(), pos.data(), table, N, H, D); });
    const int64_t P = 20'000'000;
    auto p = random_floats(size_t(P), 14), gr = random_floats(size_t(P), 15);
    std::vector<float> m(size_t(P), 0.0f), vv(size_t(P), 0.0f);
    int64_t step = 0;
    glue("adamw 20M params", 28.0 * P, [&] {
      adamw_step(p.data(), gr.data(), m.data(), vv.data(), P, AdamWStep{1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, ++step});
    });
  }
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(1);
  return 0;
}
