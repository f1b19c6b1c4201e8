// `ktune plan --device cuda` through the built binary: the GPU step's per-GPU memory, planned by the
// plugin without touching a device (this machine has no GPU: a plan that reached for one would fail
// here). A build without the CUDA backend says so and the cases skip, visibly.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "tiny_recipe_run.h"

namespace ktune {
namespace {

using recipe_testing::kKtune;
using recipe_testing::Outcome;
using recipe_testing::sh;

Outcome plan(const std::string& args) { return sh(kKtune + " plan --device cuda " + args); }

// "12.345 GiB" as `ktune plan` prints bytes.
std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f GiB", bytes / double(1ull << 30));
  return text;
}

// The figure after `label` (e.g. "  total        ") in the plan's output, as printed ("4.424 GiB").
std::string figure(const std::string& output, const std::string& label) {
  const size_t at = output.find(label);
  if (at == std::string::npos) return "(no " + label + ")";
  const size_t from = at + label.size();
  return output.substr(from, output.find(" GiB", from) + 4 - from);
}

double value_of(const std::string& figure_text) { return std::stod(figure_text); }

// Skips the case when this build has no CUDA backend (the error says so), after checking it does.
#define SKIP_WITHOUT_CUDA_BACKEND(outcome)                                                      \
  if ((outcome).output.find("has no CUDA backend") != std::string::npos) {                     \
    EXPECT_NE((outcome).exit_code, 0);                                                          \
    GTEST_SKIP() << "this build has no CUDA backend: `ktune plan --device cuda` refuses, as it should"; \
  }

// Llama-3.2-1B's parameters, counted from its shapes (tied embeddings): every tensor's element count
// is a multiple of 128, so each bf16 value, f32 gradient and pair of bf16 moments lies whole in the
// 256-byte slices the plan carves.
constexpr int64_t kLlama1bParameters = [] {
  const int64_t V = 128256, C = 2048, L = 16, QD = 2048, KD = 512, I = 8192;
  return V * C + L * (C * QD + 2 * C * KD + QD * C + 3 * C * I + 2 * C) + C;
}();

TEST(GpuPlanCli, AFullFinetuneOnOneGpuHoldsEveryValueGradientAndMomentOnce) {
  static_assert(kLlama1bParameters == 1235814400, "Llama-3.2-1B has 1,235,814,400 parameters");
  Outcome r = plan("--model llama3_2/1B --recipe full --batch_size 1 --max_seq_len 256");
  SKIP_WITHOUT_CUDA_BACKEND(r);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const double P = double(kLlama1bParameters);
  EXPECT_EQ(figure(r.output, "  parameters   "), gib(2 * P)) << r.output;  // bf16 values
  EXPECT_EQ(figure(r.output, "  gradients    "), gib(4 * P)) << r.output;  // f32
  EXPECT_EQ(figure(r.output, "  AdamW state  "), gib(4 * P)) << r.output;  // two bf16 moments
  EXPECT_NE(r.output.find("world: one GPU"), std::string::npos) << r.output;
  // The total is the four parts (each printed rounded: within their rounding).
  const double parts = value_of(figure(r.output, "  parameters   ")) + value_of(figure(r.output, "  gradients    ")) +
                       value_of(figure(r.output, "  AdamW state  ")) + value_of(figure(r.output, "  activations  "));
  EXPECT_NEAR(value_of(figure(r.output, "  total        ")), parts, 0.003) << r.output;
  EXPECT_NE(r.output.find("H100 80GB (79.6 GiB) yes"), std::string::npos) << r.output;
}

TEST(GpuPlanCli, EightGpusShardTheFullFinetuneAndReplicasDoNot) {
  const std::string model =
      "--model llama3_2/1B --recipe full --batch_size 2 --max_seq_len 2048 --activation_checkpointing";
  Outcome one = plan(model);
  SKIP_WITHOUT_CUDA_BACKEND(one);
  Outcome sharded = plan(model + " --nproc_per_node 8");
  Outcome replicas = plan(model + " --nproc_per_node 8 --replicate");
  Outcome zero2 = plan(model + " --nproc_per_node 8 --reshard_after_forward false");
  for (const Outcome* r : {&one, &sharded, &replicas, &zero2}) ASSERT_EQ(r->exit_code, 0) << r->output;
  EXPECT_NE(sharded.output.find("the gradients (ZeRO-2), the layers' weights (ZeRO-3)"), std::string::npos)
      << sharded.output;
  EXPECT_NE(zero2.output.find("the gradients (ZeRO-2); the embedding"), std::string::npos) << zero2.output;
  EXPECT_NE(replicas.output.find("each a replica"), std::string::npos) << replicas.output;
  auto total = [](const Outcome& r) { return value_of(figure(r.output, "  total        ")); };
  EXPECT_EQ(figure(replicas.output, "  total        "), figure(one.output, "  total        "));
  EXPECT_LT(total(zero2), total(one));
  EXPECT_LT(total(sharded), total(zero2));
  // ZeRO-3's parameters: this GPU's eighth of the layers' plus two layers' slots, the tied embedding whole.
  EXPECT_LT(value_of(figure(sharded.output, "  parameters   ")), value_of(figure(zero2.output, "  parameters   ")) / 2)
      << sharded.output;
}

TEST(GpuPlanCli, QloraHoldsItsBasesInNf4AndOffloadingNeedsCheckpointing) {
  const std::string lora = "--model llama3_2/3B --recipe lora --lora_attn_modules q_proj,v_proj,output_proj "
                           "--apply_lora_to_mlp --batch_size 2 --max_seq_len 4096 --activation_checkpointing";
  Outcome plain = plan(lora + " --activation_offloading");
  SKIP_WITHOUT_CUDA_BACKEND(plain);
  Outcome qlora = plan(lora + " --activation_offloading --quantize_base");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(qlora.exit_code, 0) << qlora.output;
  EXPECT_NE(qlora.output.find("QLoRA rank 8"), std::string::npos) << qlora.output;
  EXPECT_NE(qlora.output.find("(NF4 codes and scales "), std::string::npos) << qlora.output;
  EXPECT_NE(plain.output.find("pinned host"), std::string::npos) << plain.output;
  // NF4 at 4.25 bits a weight against bf16's 16: the base shrinks to under a third.
  EXPECT_LT(value_of(figure(qlora.output, "  parameters   ")), value_of(figure(plain.output, "  parameters   ")) / 2.5);
  Outcome refused = sh(kKtune + " plan --device cuda --model llama3_2/3B --recipe lora --activation_offloading");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.output.find("--activation_checkpointing"), std::string::npos) << refused.output;
}

TEST(GpuPlanCli, GpuFlagsWithoutDeviceCudaFp32AndUnknownDevicesAreRefused) {
  Outcome r = sh(kKtune + " plan --model llama3_2/1B --batch_size 4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("ktune plan --batch_size: plans the GPU step's memory: it needs --device cuda"),
            std::string::npos)
      << r.output;
  Outcome fp32 = sh(kKtune + " plan --model llama3_2/1B --device cuda --dtype fp32");
  EXPECT_NE(fp32.exit_code, 0);
  EXPECT_TRUE(fp32.output.find("the GPU step trains in bf16 only") != std::string::npos ||
              fp32.output.find("has no CUDA backend") != std::string::npos)
      << fp32.output;
  Outcome wrong = sh(kKtune + " plan --model llama3_2/1B --device tpu");
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.output.find("'tpu' is neither cpu nor cuda"), std::string::npos) << wrong.output;
}

}  // namespace
}  // namespace ktune
