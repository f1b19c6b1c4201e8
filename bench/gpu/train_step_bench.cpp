// ktune's training step on the GPU (src/model/cuda/decoder.h) at Llama-3.2-1B's shape: random
// weights, random tokens (next-token labels, the last position of each row ignored), a timed loop
// of zero_grad + forward/backward + AdamW. One mode a run:
//   --mode=lora   torchtune's llama3_2/1B_lora_single_device: rank 64, alpha 128 on q_proj, v_proj,
//                 output_proj (o_proj) and the MLP (gate, up, down); base frozen
//   --mode=full   every parameter trainable (torchtune's 1B_full_single_device, bf16 AdamW)
//   --mode=qlora  the LoRA setup over an NF4 base (torchtune's llama3_2/*_qlora_single_device)
// Prints the memory plan and one machine-readable line:
//   RESULT side=ktune model=1b mode=M activation_checkpointing=0 activation_offloading=0 attention=A batch=B seq=T
//          steps=S step_ms=X tokens_per_s=Y flops_per_token=F
//          tflops=Z mfu=U loss_first=A loss_last=L planned_gib=P device_used_gib=D
//          run_used_gib=R (D less what the device held before the model) ...
// MFU is against 990 TFLOP/s (H200 dense bf16) with the FLOPs counted by flops_per_token (below;
// bench/gpu/train_step_compare.py uses the same count for PyTorch). Exit 77 without a GPU.
// Options: --batch=4 --seq=2048 --layers=16 --steps=6 --warmup=2 --max-seconds=20
//          --model=1b (Llama-3.2-1B's shape, the default) | 3b (Llama-3.2-3B's: 3072 wide, 28 layers,
//          24/8 heads of 128, MLP 8192; torchtune publishes its memory for LoRA/QLoRA at batch 2 x 4096)
//          --activation-checkpointing=1 (torchtune's enable_activation_checkpointing; 0 by default)
//          --activation-offloading=1 (torchtune's enable_activation_offloading, with checkpointing; 0 by default)
//          --ce-chunk=512 (tokens per chunk of the fused loss; 0, the default, is the decoder's own)
//          --attention=auto (the default, as the recipes: every kernel timed on one layer, the fastest
//          that agrees with the others taken, model/cuda/attention_choice.h; its line is printed) | gemm
//          (tensor-core GEMMs) | tensor_core (the fused FlashAttention-2, flash_attention_tc.h) | flash
//          (the tiled CUDA-core kernel). RESULT's attention= is the kernel that ran.
//          --nf4-gemm=dequantize (qlora: W into bf16 scratch, then cuBLASLt; the default) | fused
//          (kernels/cuda/nf4_gemm.h, TrainingSetup::nf4_fused_gemm)
// It deliberately has no data loading, no checkpointing, no gradient accumulation: the step only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/cuda/activation.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/device_memory.h"
#include "model/cuda/attention_choice.h"
#include "model/cuda/decoder.h"

namespace {

constexpr double kPeakTflops = 990.0;  // H200 SXM, dense bf16

// Host time per launch, with the launch queue held open: the default stream first waits for an event
// recorded behind ~30 GiB of memsets on a stream of their own (milliseconds of device work), so the
// launches enqueued meanwhile neither wait for room in the queue (there are far fewer of them than
// its depth) nor for the device: the time is the host's alone. Without that hold, a step's host
// time equals its device time both when the GPU waits for the host and when the host waits for a
// full queue. Per cuBLASLt call of the GEMM attention path's shape (a strided batch of `batch`
// (512 x 1024 x 64) scores) and per small kernel launch; -1 where the memsets ended before the
// launches did (the figure would hold device time).
struct LaunchCost {
  double gemm_us = -1, kernel_us = -1;
};

LaunchCost measure_launch_cost(int64_t batch) {
  using namespace ktune;
  const int kLaunches = 200, kMemsets = 30;
  const size_t kMemsetBytes = size_t(1) << 30;
  const int64_t M = 512, N = 1024, K = 64;
  cuda::DeviceBuffer held(kMemsetBytes), a(size_t(batch * M * K) * 2), b(size_t(batch * N * K) * 2),
      c(size_t(batch * M * N) * 4), x(4096 * 2), y(4096 * 2);
  cudaStream_t side = nullptr;
  cudaEvent_t done = nullptr;
  if (cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) != cudaSuccess || cudaEventCreate(&done) != cudaSuccess)
    return {};
  cuda::GemmContext ctx;
  cuda::GemmCall g;  // S (M, N) f32 = Q (M, K) K^T, batched as the attention path's scores
  g.trans_b = true, g.M = M, g.N = N, g.K = K, g.A = a.data(), g.lda = K, g.B = b.data(), g.ldb = K, g.C = c.data(),
  g.ldc = N, g.in = DType::BF16, g.out = DType::F32, g.batch = batch, g.stride_a = M * K, g.stride_b = N * K,
  g.stride_c = M * N;
  auto held_time_us = [&](auto&& launch) {
    launch();  // plans cached, the kernel loaded
    cuda::synchronize();
    for (int i = 0; i < kMemsets; ++i) cudaMemsetAsync(held.data(), i, kMemsetBytes, side);
    cudaEventRecord(done, side);
    cudaStreamWaitEvent(nullptr, done, 0);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunches; ++i) launch();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const bool still_held = cudaEventQuery(done) == cudaErrorNotReady;
    cuda::synchronize();
    return still_held ? us / kLaunches : -1.0;
  };
  LaunchCost cost;
  cost.gemm_us = held_time_us([&] { ctx.run(g, nullptr); });
  cost.kernel_us = held_time_us([&] { cuda::swiglu_forward(y.as<bf16_t>(), x.as<bf16_t>(), x.as<bf16_t>(), 4096); });
  cudaEventDestroy(done);
  cudaStreamDestroy(side);
  return cost;
}

// Matmul FLOPs of one token's step, attention included (causal: half the T x T products).
//   base projections + head: Pm = L (C QD + 2 C KD + QD C + 3 C I) + V C
//   LoRA matrices:           Pl = sum over adapted projections of r (in + out)
//   attention per layer:     forward 2 T QD (QK^T and PV over T/2 keys on average), backward 2x
// full: 6 Pm + 6 Pl + 6 L T QD;  LoRA (no weight gradient for the base): 4 Pm + 6 Pl + 6 L T QD
double flops_per_token(const ktune::cuda::DecoderConfig& c, const ktune::cuda::TrainingSetup& s) {
  const double C = double(c.hidden_size), I = double(c.intermediate_size), QD = double(c.num_heads * c.head_dim),
               KD = double(c.num_kv_heads * c.head_dim), L = double(c.num_layers), V = double(c.vocab_size),
               T = double(s.seq_len), r = double(s.lora_rank);
  const double pm = L * (C * QD + 2 * C * KD + QD * C + 3 * C * I) + V * C;
  const double dims[7][2] = {{C, QD}, {C, KD}, {C, KD}, {QD, C}, {C, I}, {C, I}, {I, C}};
  double pl = 0;
  for (int p = 0; p < 7; ++p)
    if (s.lora_rank > 0 && s.lora_on[p]) pl += L * r * (dims[p][0] + dims[p][1]);
  const double attention = 6 * L * T * QD;
  return (s.full_finetune ? 6 : 4) * pm + 6 * pl + attention;
}

int64_t arg(int argc, char** argv, const std::string& key, int64_t fallback) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--" + key + "=", 0) == 0) return std::atoll(a.c_str() + key.size() + 3);
  }
  return fallback;
}

std::string arg_s(int argc, char** argv, const std::string& key, const std::string& fallback) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--" + key + "=", 0) == 0) return a.substr(key.size() + 3);
  }
  return fallback;
}

int run(int argc, char** argv) {
  using namespace ktune;
  const std::string mode = arg_s(argc, argv, "mode", "lora");
  if (mode != "lora" && mode != "full" && mode != "qlora") {
    std::fprintf(stderr, "--mode must be lora, qlora or full, not %s\n", mode.c_str());
    return 2;
  }
  const std::string model_name = arg_s(argc, argv, "model", "1b");
  if (model_name != "1b" && model_name != "3b") {
    std::fprintf(stderr, "--model must be 1b or 3b, not %s\n", model_name.c_str());
    return 2;
  }
  if (cuda::device_count() == 0) {
    std::printf("SKIP train_step_bench: %s\n", cuda::device_description().c_str());
    return 77;
  }
  cuda::DecoderConfig config = cuda::DecoderConfig::llama3_2_1b();
  if (model_name == "3b") {  // meta-llama/Llama-3.2-3B's config.json (the rest as 1B's: vocab, rope, tied)
    config.hidden_size = 3072, config.num_layers = 28, config.num_heads = 24, config.num_kv_heads = 8;
    config.head_dim = 128, config.intermediate_size = 8192;
  }
  config.num_layers = arg(argc, argv, "layers", config.num_layers);
  cuda::TrainingSetup setup;
  setup.batch = arg(argc, argv, "batch", 4);
  setup.seq_len = arg(argc, argv, "seq", 2048);
  if (mode == "full") {
    setup.full_finetune = true;
  } else {
    setup.lora_rank = 64;
    setup.lora_alpha = 128;
    for (int p : {cuda::kQ, cuda::kV, cuda::kO, cuda::kGate, cuda::kUp, cuda::kDown}) setup.lora_on[p] = true;
    setup.quantize_base = mode == "qlora";
    setup.quantize_unadapted = setup.quantize_base;  // a Llama: k_proj's base NF4 too, as torchtune's QLoRA
  }
  setup.activation_checkpointing = arg(argc, argv, "activation-checkpointing", 0) != 0;
  setup.activation_offloading = arg(argc, argv, "activation-offloading", 0) != 0;
  setup.ce_chunk_tokens = arg(argc, argv, "ce-chunk", 0);
  const std::string asked = arg_s(argc, argv, "attention", "auto");
  if (asked != "auto" && asked != "gemm" && asked != "tensor_core" && asked != "flash") {
    std::fprintf(stderr, "--attention must be auto, gemm, tensor_core or flash, not %s\n", asked.c_str());
    return 2;
  }
  setup.attention = asked == "gemm"          ? cuda::TrainingSetup::Attention::kGemm
                    : asked == "tensor_core" ? cuda::TrainingSetup::Attention::kTensorCore
                    : asked == "flash"       ? cuda::TrainingSetup::Attention::kFlash
                                             : cuda::TrainingSetup::Attention::kAuto;
  if (setup.attention == cuda::TrainingSetup::Attention::kAuto) {  // as the recipes choose (attention_choice.h)
    const cuda::LayerTrials timed = cuda::time_attention_kernels_for_layers(config, setup, 0);  // unpacked rows
    setup.attention = cuda::pick_attention(timed.trials);
    std::printf("%s\n", cuda::describe_attention_trials(timed, setup.attention).c_str());
  }
  const std::string attention = cuda::attention_name(setup.attention);
  const std::string nf4_gemm = arg_s(argc, argv, "nf4-gemm", "dequantize");
  if (nf4_gemm != "dequantize" && nf4_gemm != "fused") {
    std::fprintf(stderr, "--nf4-gemm must be dequantize or fused, not %s\n", nf4_gemm.c_str());
    return 2;
  }
  setup.nf4_fused_gemm = nf4_gemm == "fused";
  const int64_t steps = arg(argc, argv, "steps", 6), warmup = arg(argc, argv, "warmup", 2);
  const double max_seconds = double(arg(argc, argv, "max-seconds", 20));
  std::printf("device: %s\n", cuda::device_description().c_str());
  std::printf("config: Llama-3.2-%s shape (vocab %lld, dim %lld, %lld layers, %lld/%lld heads, hidden %lld, tied), "
              "batch %lld x seq %lld, mode %s%s%s%s%s, attention %s\n",
              model_name == "3b" ? "3B" : "1B", (long long)config.vocab_size, (long long)config.hidden_size, (long long)config.num_layers,
              (long long)config.num_heads, (long long)config.num_kv_heads, (long long)config.intermediate_size,
              (long long)setup.batch, (long long)setup.seq_len, mode.c_str(),
              mode == "full" ? "" : " (rank 64, alpha 128 on q,v,o,gate,up,down)",
              setup.activation_checkpointing ? ", activation checkpointing" : "",
              setup.activation_offloading ? " and offloading" : "",
              setup.quantize_base && setup.nf4_fused_gemm ? ", NF4 dequantised inside the GEMMs (nf4_gemm.h)" : "",
              attention == "gemm"          ? "tensor-core GEMMs (attention_gemm.h)"
              : attention == "tensor_core" ? "fused tensor-core FlashAttention-2 (flash_attention_tc.h)"
                                           : "tiled CUDA-core kernel (attention.h)");

  // What the device holds before the model (the CUDA context, other processes): the run's own
  // memory is device_used minus this.
  size_t used_before = 0, total_before = 0;
  cuda::device_memory_info(&used_before, &total_before);
  cuda::Decoder model(config, setup, 1234);
  std::printf("parameters: %lld, trainable %lld\n", (long long)model.parameter_count(false),
              (long long)model.parameter_count(true));
  std::printf("%s\n", model.memory_report().c_str());
  std::fflush(stdout);

  const int64_t N = setup.batch * setup.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(N)), labels(static_cast<size_t>(N));
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> token(0, int32_t(config.vocab_size - 1));
  for (auto& t : tokens) t = token(rng);
  for (int64_t b = 0; b < setup.batch; ++b)
    for (int64_t t = 0; t < setup.seq_len; ++t)
      labels[size_t(b * setup.seq_len + t)] =
          t + 1 < setup.seq_len ? tokens[size_t(b * setup.seq_len + t + 1)] : cuda::kIgnoreIndex;

  cpu::AdamWStep st{mode == "full" ? 2e-5f : 3e-4f};
  st.weight_decay = 0.01f;
  int64_t step_no = 0;
  double loss_first = 0, loss_last = 0;
  auto one_step = [&] {
    model.zero_grad();
    const cuda::StepResult r = model.forward_backward(tokens.data(), labels.data(), 1.0f / float(N - setup.batch));
    st.step = ++step_no;
    model.adamw_step(st, uint64_t(step_no));
    const double loss = r.loss_sum / double(r.n_valid);
    if (step_no == 1) loss_first = loss;
    loss_last = loss;
  };
  using clock = std::chrono::steady_clock;
  for (int64_t i = 0; i < warmup; ++i) {
    const auto t0 = clock::now();
    one_step();
    cuda::synchronize();
    std::printf("warm-up step %lld: %.1f ms, loss %.4f\n", (long long)step_no,
                std::chrono::duration<double, std::milli>(clock::now() - t0).count(), loss_last);
    std::fflush(stdout);
  }
  size_t used_after = 0, total = 0;
  cuda::device_memory_info(&used_after, &total);
  const auto start = clock::now();
  int64_t timed = 0;
  while (timed < steps) {
    one_step();
    ++timed;
    cuda::synchronize();
    if (std::chrono::duration<double>(clock::now() - start).count() > max_seconds) break;
  }
  const double seconds = std::chrono::duration<double>(clock::now() - start).count();
  // One more step with CUDA events around attention and the loss head: where the time goes.
  model.set_profiling(true);
  one_step();
  cuda::synchronize();
  const cuda::Decoder::StepProfile prof = model.last_profile();
  model.set_profiling(false);
  const double step_ms = 1000.0 * seconds / double(timed);
  const double tokens_per_s = double(N) * double(timed) / seconds;
  const double fpt = flops_per_token(config, setup);
  const double tflops = tokens_per_s * fpt / 1e12;
  std::printf("after the steps: %s\n", model.memory_report().c_str());
  std::printf("profile (one step, forward+backward on the device %.1f ms): attention fwd+bwd %.1f ms (%.0f%%), "
              "output projection + loss %.1f ms (%.0f%%), the rest (projections, norms, rope, MLP) %.1f ms\n",
              prof.step_ms, prof.attention_ms, 100 * prof.attention_ms / prof.step_ms, prof.loss_ms,
              100 * prof.loss_ms / prof.step_ms, prof.step_ms - prof.attention_ms - prof.loss_ms);
  // The GEMM calls' host time at the measured per-call cost, against the step's device time: the
  // kernels' launches (a few per layer and head on the GEMM attention path) come on top.
  const LaunchCost launch = measure_launch_cost(setup.batch);
  const double gemm_host_ms = launch.gemm_us > 0 ? double(prof.gemm_calls) * launch.gemm_us / 1000.0 : -1.0;
  std::printf("profile (host): %lld GEMM calls a step; the backward enqueued in %.1f ms on the host and ran %.1f ms on "
              "the device\n",
              (long long)prof.gemm_calls, prof.backward_host_ms, prof.backward_device_ms);
  if (gemm_host_ms > 0)
    std::printf("profile (host): launch cost with the queue held open: %.2f us a cuBLASLt call, %.2f us a kernel; the "
                "step's GEMM calls alone take %.1f ms of host time against its %.1f ms on the device (%s)\n",
                launch.gemm_us, launch.kernel_us, gemm_host_ms, prof.step_ms,
                gemm_host_ms > 0.8 * prof.step_ms ? "host-bound: the GPU waits for its launches; fewer, larger ones pay"
                                                   : "the host keeps ahead of the device");
  else
    std::printf("profile (host): launch cost not measured (the memsets holding the queue ended first)\n");
  std::printf("RESULT side=ktune model=%s mode=%s activation_checkpointing=%d activation_offloading=%d attention=%s "
              "batch=%lld seq=%lld steps=%lld step_ms=%.2f tokens_per_s=%.1f "
              "flops_per_token=%.6e tflops=%.2f mfu=%.4f loss_first=%.4f loss_last=%.4f planned_gib=%.3f "
              "device_used_gib=%.3f run_used_gib=%.3f attention_ms=%.1f loss_ms=%.1f fwd_bwd_ms=%.1f gemm_calls=%lld "
              "backward_host_ms=%.1f backward_device_ms=%.1f gemm_call_us=%.2f kernel_launch_us=%.2f gemm_host_ms=%.1f\n",
              model_name.c_str(), mode.c_str(), int(setup.activation_checkpointing), int(setup.activation_offloading),
              attention.c_str(), (long long)setup.batch, (long long)setup.seq_len, (long long)timed, step_ms,
              tokens_per_s,
              fpt, tflops, tflops / kPeakTflops, loss_first, loss_last,
              double(model.memory_plan().total()) / double(1ull << 30), double(used_after) / double(1ull << 30),
              double(used_after - std::min(used_after, used_before)) / double(1ull << 30), prof.attention_ms, prof.loss_ms, prof.step_ms,
              (long long)prof.gemm_calls, prof.backward_host_ms, prof.backward_device_ms, launch.gemm_us,
              launch.kernel_us, gemm_host_ms);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::printf("ERROR train_step_bench: %s\n", e.what());
    return 1;
  }
}
