// ktune's GPU GEMM rate: bf16 (M,K) @ (K,N) -> bf16 through cuBLASLt (kernels/cuda/gemm.h), f32
// accumulation, timed with CUDA events. Prints one line a shape:
//   ktune_gemm M N K TFLOPS
// for the shapes given as MxNxK arguments (default: square 4096/8192 and the GEMMs of a
// Llama-3.2-1B step at 8 x 2048 tokens). bench/gpu/gemm_compare.py puts torch.matmul beside it.
// Exit 77 without a GPU. It deliberately measures only the GEMM (no step, no model).
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/gemm.h"

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
  return 0;
}
