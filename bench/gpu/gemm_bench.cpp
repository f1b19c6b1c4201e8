// ktune's GPU GEMM rate: bf16 (M,K) @ (K,N) -> bf16 through cuBLASLt (kernels/cuda/gemm.h), f32
// accumulation, timed with CUDA events. Prints one line a shape:
//   ktune_gemm M N K TFLOPS
// for the shapes given as MxNxK arguments (default: square 4096/8192 and the GEMMs of a
// Llama-3.2-1B step at 8 x 2048 tokens), then one line for causal attention forward+backward
// (bf16, kernels/cuda/attention.h) at Llama-3.2-1B's heads (32 query, 8 kv, head_dim 64):
//   ktune_attention B T Hq Hkv D FWD_MS BWD_MS TFLOPS
// and the same for the tensor-core GEMM path (kernels/cuda/attention_gemm.h):
//   ktune_attention_gemm B T Hq Hkv D FWD_MS BWD_MS TFLOPS
// and for the fused tensor-core flash attention (kernels/cuda/flash_attention_tc.h):
//   ktune_attention_tc B T Hq Hkv D FWD_MS BWD_MS TFLOPS
// then QLoRA's NF4 GEMMs at Llama-3.2-3B's gate_proj (8192 tokens, W 8192 x 3072), a linear's forward
// y = x W^T and input gradient dx = dy W, each the plain way (nf4_dequantize into scratch, then
// cuBLASLt) and fused (kernels/cuda/nf4_gemm.h), bf16 out:
//   ktune_nf4 M OUT IN PLAIN_FWD_MS FUSED_FWD_MS PLAIN_BWD_MS FUSED_BWD_MS
// bench/gpu/gemm_compare.py puts torch.matmul and torch's scaled_dot_product_attention beside them.
// Exit 77 without a GPU. It deliberately measures kernels only (no step, no model).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/nf4.h"
#include "kernels/cuda/nf4_gemm.h"

namespace {

// Milliseconds per call of fn, by CUDA events over `reps` calls after one warm-up.
template <typename Fn>
double time_ms(Fn fn, int reps) {
  fn();
  cudaDeviceSynchronize();
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < reps; ++i) fn();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / reps;
}

// Times fwd and bwd (3 calls each after a warm-up) and prints "TAG B T Hq Hkv D FWD_MS BWD_MS TFLOPS".
// Causal: half of the T x T scores. Forward 2 GEMMs (QK^T, PV), backward 5 (as FlashAttention counts).
template <typename Fwd, typename Bwd>
void report_attention(const char* tag, const ktune::cuda::AttentionShape& s, Fwd fwd, Bwd bwd) {
  const double fwd_ms = time_ms(fwd, 3), bwd_ms = time_ms(bwd, 3);
  ktune::cuda::synchronize();  // surfaces a kernel fault as ktune::Error
  const double fwd_flops = 4.0 * double(s.B) * double(s.Hq) * double(s.T) * double(s.T) * double(s.D) / 2.0;
  const double tflops = fwd_flops * 3.5 / ((fwd_ms + bwd_ms) * 1e-3) / 1e12;
  std::printf("%s %lld %lld %lld %lld %lld %.3f %.3f %.2f\n", tag, (long long)s.B, (long long)s.T, (long long)s.Hq,
              (long long)s.Hkv, (long long)s.D, fwd_ms, bwd_ms, tflops);
  std::fflush(stdout);
}

void bench_attention(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  using ktune::bf16_t;
  ktune::cuda::AttentionShape s{B, T, Hq, Hkv, D, 1.0f / 8.0f};
  const size_t nq = size_t(B * T * Hq * D), nkv = size_t(B * T * Hkv * D);
  ktune::cuda::DeviceBuffer q(nq * 2), k(nkv * 2), v(nkv * 2), out(nq * 2), dout(nq * 2), dq(nq * 2), dk(nkv * 2),
      dv(nkv * 2), lse(size_t(B * Hq * T) * 4), scratch(size_t(ktune::cuda::attention_backward_scratch_floats(s)) * 4);
  for (auto* b : {&q, &k, &v, &dout}) cudaMemset(b->data(), 0x3c, b->bytes());  // 0.0115 everywhere
  auto fwd = [&] {
    ktune::cuda::attention_forward(out.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(),
                                   nullptr, s);
  };
  auto bwd = [&] {
    ktune::cuda::attention_backward(dq.as<bf16_t>(), dk.as<bf16_t>(), dv.as<bf16_t>(), dout.as<bf16_t>(),
                                    q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(), out.as<bf16_t>(), lse.as<float>(),
                                    nullptr, s, scratch.as<float>());
  };
  report_attention("ktune_attention", s, fwd, bwd);
  // The tensor-core path (attention_gemm.h) on the same buffers.
  // Its failure is printed and does not take the lines above with it.
  try {
  ktune::cuda::GemmContext ctx;
  ktune::cuda::DeviceBuffer gemm_scratch(ktune::cuda::attention_gemm_scratch_bytes(s));
  auto gfwd = [&] {
    ktune::cuda::attention_gemm_forward(ctx, out.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(),
                                        v.as<bf16_t>(), s, gemm_scratch.data());
  };
  auto gbwd = [&] {
    ktune::cuda::attention_gemm_backward(ctx, dq.as<bf16_t>(), dk.as<bf16_t>(), dv.as<bf16_t>(), dout.as<bf16_t>(),
                                         q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(), out.as<bf16_t>(),
                                         lse.as<float>(), s, gemm_scratch.data());
  };
  report_attention("ktune_attention_gemm", s, gfwd, gbwd);
  } catch (const std::exception& e) {
    std::printf("ERROR attention_gemm: %s\n", e.what());
    std::fflush(stdout);
  }
  // The fused tensor-core kernel (flash_attention_tc.h) on the same buffers; its failure likewise.
  try {
    ktune::cuda::DeviceBuffer tc_scratch(size_t(ktune::cuda::flash_attention_tc_backward_scratch_floats(s)) * 4);
    auto tfwd = [&] {
      ktune::cuda::flash_attention_tc_forward(out.as<bf16_t>(), lse.as<float>(), q.as<bf16_t>(), k.as<bf16_t>(),
                                              v.as<bf16_t>(), s);
    };
    auto tbwd = [&] {
      ktune::cuda::flash_attention_tc_backward(dq.as<bf16_t>(), dk.as<bf16_t>(), dv.as<bf16_t>(), dout.as<bf16_t>(),
                                               q.as<bf16_t>(), k.as<bf16_t>(), v.as<bf16_t>(), out.as<bf16_t>(),
                                               lse.as<float>(), s, tc_scratch.as<float>());
    };
    report_attention("ktune_attention_tc", s, tfwd, tbwd);
  } catch (const std::exception& e) {
    std::printf("ERROR attention_tc: %s\n", e.what());
    std::fflush(stdout);
  }
}

// QLoRA's two GEMMs on an NF4 W (out, in) at M tokens, plain and fused (see the top of the file).
void bench_nf4(int64_t M, int64_t out, int64_t in) {
  using ktune::bf16_t;
  try {
    ktune::cuda::GemmContext ctx;
    ktune::cuda::DeviceBuffer x(size_t(M * in) * 2), y(size_t(M * out) * 2), dy(size_t(M * out) * 2),
        dx(size_t(M * in) * 2), codes(size_t(out * in / 2)), scales(size_t(out * in / 64) * 2),
        scratch(size_t(out * in) * 2);
    for (auto* b : {&x, &dy}) cudaMemset(b->data(), 0x3c, b->bytes());  // 0.0115 everywhere
    cudaMemset(codes.data(), 0x9e, codes.bytes());                     // small nonzero codes
    const std::vector<bf16_t> scale(size_t(out * in / 64), ktune::f32_to_bf16(0.05f));  // held as bf16
    scales.upload(scale.data(), scale.size() * 2);
    auto plain_fwd = [&] {
      ktune::cuda::nf4_dequantize(scratch.as<bf16_t>(), codes.as<uint8_t>(), scales.as<bf16_t>(), out * in);
      ktune::cuda::gemm_bf16_out_bf16(ctx, false, true, M, out, in, 1.0f, x.as<bf16_t>(), scratch.as<bf16_t>(), 0.0f,
                                      y.as<bf16_t>());
    };
    auto plain_bwd = [&] {
      ktune::cuda::nf4_dequantize(scratch.as<bf16_t>(), codes.as<uint8_t>(), scales.as<bf16_t>(), out * in);
      ktune::cuda::gemm_bf16_out_bf16(ctx, false, false, M, in, out, 1.0f, dy.as<bf16_t>(), scratch.as<bf16_t>(), 0.0f,
                                      dx.as<bf16_t>());
    };
    ktune::cuda::Nf4GemmCall f;
    f.M = M, f.N = out, f.K = in, f.A = x.as<bf16_t>(), f.codes = codes.as<uint8_t>(), f.scales = scales.as<bf16_t>();
    f.w_transposed = true, f.C = y.as<bf16_t>(), f.out = ktune::DType::BF16;
    ktune::cuda::Nf4GemmCall b = f;
    b.N = in, b.K = out, b.A = dy.as<bf16_t>(), b.w_transposed = false, b.C = dx.as<bf16_t>();
    const double pf = time_ms(plain_fwd, 5), ff = time_ms([&] { ktune::cuda::nf4_gemm(f); }, 5);
    const double pb = time_ms(plain_bwd, 5), fb = time_ms([&] { ktune::cuda::nf4_gemm(b); }, 5);
    ktune::cuda::synchronize();  // surfaces a kernel fault as ktune::Error
    std::printf("ktune_nf4 %lld %lld %lld %.3f %.3f %.3f %.3f\n", (long long)M, (long long)out, (long long)in, pf, ff, pb,
                fb);
  } catch (const std::exception& e) {
    std::printf("ERROR nf4 gemm: %s\n", e.what());
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> shapes;
  double seconds = 1.0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0) seconds = std::atof(a.c_str() + 10);
    else shapes.push_back(a);
  }
  if (shapes.empty())
    shapes = {"4096x4096x4096", "8192x8192x8192",
              "16384x2048x2048",   // q/o projection: tokens x hidden x hidden
              "16384x8192x2048",   // gate/up projection
              "16384x2048x8192",   // down projection
              "16384x128256x2048"};  // lm_head over the full vocabulary
  try {
  if (ktune::cuda::device_count() == 0) {
    std::printf("SKIP ktune_gpu_gemm_bench: %s\n", ktune::cuda::device_description().c_str());
    return 77;
  }
  std::printf("device: %s\n", ktune::cuda::device_description().c_str());
  ktune::cuda::GemmContext ctx;
  for (const auto& shape : shapes) {
    long long M = 0, N = 0, K = 0;
    if (std::sscanf(shape.c_str(), "%lldx%lldx%lld", &M, &N, &K) != 3 || M <= 0 || N <= 0 || K <= 0) {
      std::fprintf(stderr, "bad shape '%s' (want MxNxK)\n", shape.c_str());
      return 2;
    }
    double tflops = ktune::cuda::measure_gemm_bf16_tflops(ctx, M, N, K, seconds);
    std::printf("ktune_gemm %lld %lld %lld %.1f\n", M, N, K, tflops);
    std::fflush(stdout);
  }
  bench_attention(4, 2048, 32, 8, 64);
  bench_nf4(8192, 8192, 3072);
  } catch (const std::exception& e) {
    std::printf("ERROR %s\n", e.what());
    return 1;
  }
  return 0;
}
