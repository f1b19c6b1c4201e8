// device=cuda through `ktune run`, on the quickstart's tiny Llama model in bf16.
// With a GPU visible (and the CUDA backend built): the LoRA and full recipes on the GPU track the
// same runs on the CPU engine step by step, write the same checkpoint layout (the PEFT adapter with
// the CPU run's tensor names and shapes, the merged model), resume mid-epoch, and two GPUs over NCCL
// (the AdamW state sharded, or replicated) equal one with the doubled batch and resume. The two engines round differently (the GPU keeps activations
// and LoRA matrices in bf16, the CPU adapters in f32), so losses are compared within a few percent,
// not bit for bit.
// Without a GPU those are skipped, saying so, and the one that runs instead is the fallback:
// device=cuda trains on the CPU and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <regex>

#include "io/safetensors.h"
#include "model/decoder.h"
#include "train/cuda_trainer.h"
#include "../recipes/tiny_recipe_run.h"

namespace fs = std::filesystem;
using namespace ktune;
using recipe_testing::losses;
using recipe_testing::Outcome;

namespace {

// The GPU runs need N GPUs, or, where env KTUNE_TEST_CUDA_STEP_PLUGIN names the emulated GPU step
// (CTest's ktune_cuda_recipe_tests_emulated, tests/kernels/cuda/emulator: one device, no GPU), that
// plugin, which the `ktune run` processes then load through KTUNE_CUDA_STEP_PLUGIN.
bool emulated() {
  const char* plugin = std::getenv("KTUNE_TEST_CUDA_STEP_PLUGIN");
  return plugin && *plugin;
}

#define SKIP_WITHOUT_GPUS(n)                                                                              \
  if (emulated()) setenv("KTUNE_CUDA_STEP_PLUGIN", std::getenv("KTUNE_TEST_CUDA_STEP_PLUGIN"), 1);        \
  if (train::cuda_devices_visible() < (n))                                                                \
  GTEST_SKIP() << "needs " << (n) << " GPU(s) and the CUDA backend: " << train::cuda_devices_visible()    \
               << " visible (build with CUDA: " << (train::cuda_backend_built() ? "yes" : "no") << ")"

// Run sizes: as written on a GPU; on the emulated step, where a step takes seconds, at most 3 steps
// of batch 2 (the comparisons are the same, over fewer steps).
int steps(int n) { return emulated() ? std::min(n, 3) : n; }
std::string sized(int steps_per_epoch, int batch) {
  return "max_steps_per_epoch=" + std::to_string(steps(steps_per_epoch)) +
         " batch_size=" + std::to_string(emulated() ? 2 : batch);
}

// Every step's loss of `b` within `relative` of `a`'s, the same steps, and the loss fell on both.
void expect_tracks(const std::map<int, double>& a, const std::map<int, double>& b, double relative) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [step, loss] : a) {
    ASSERT_TRUE(b.count(step)) << "step " << step;
    EXPECT_NEAR(b.at(step), loss, relative * loss) << "step " << step;
  }
  EXPECT_LT(b.rbegin()->second, b.begin()->second);
  EXPECT_LT(a.rbegin()->second, a.begin()->second);
}

// Step → the value of `metric` anywhere on the step's line of the run's log (grad_norm follows loss and lr).
std::map<int, double> metric(const std::string& output_dir, const std::string& name) {
  std::map<int, double> result;
  const std::regex pattern("Step (\\d+) \\|.* " + name + ":([0-9.eE+-]+)");
  for (const auto& e : fs::directory_iterator(fs::path(output_dir) / "logs")) {
    std::ifstream in(e.path());
    std::string line;
    std::smatch m;
    while (std::getline(in, line))
      if (std::regex_search(line, m, pattern)) result[std::stoi(m[1])] = std::stod(m[2]);
  }
  return result;
}

// Tensor names and shapes of a safetensors file.
std::map<std::string, std::vector<int64_t>> layout(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  std::map<std::string, std::vector<int64_t>> result;
  for (const std::string& name : f.names()) result[name] = f.to_f32(name).shape().dims;
  return result;
}

// What a rank's host model holds once the GPU step has every value, as the run logged it:
// parameter values, gradients and (QLoRA) the adapters' NF4 bases, in bytes, or whether it says a
// save quantises them from the frozen base it keeps.
struct HostHeld {
  int64_t values = -1, gradients = -1, nf4 = 0;
  bool nf4_made_at_save = false;
};
HostHeld host_held(const std::string& output, int rank) {
  const std::regex line("\\[rank" + std::to_string(rank) +
                        "\\] INFO: host model after the upload to the GPU: (\\d+) bytes of parameter values "
                        "\\([^)]*\\) and (\\d+) bytes of gradients held(, and the adapters' NF4 bases: (\\d+) bytes)?"
                        "(, the adapters' NF4 bases quantised from the frozen base as a save merges them)?");
  std::smatch m;
  HostHeld held;
  if (!std::regex_search(output, m, line)) return held;
  held.values = std::stoll(m[1]);
  held.gradients = std::stoll(m[2]);
  if (m[4].matched) held.nf4 = std::stoll(m[4]);
  held.nf4_made_at_save = m[5].matched;
  return held;
}

// The values of a safetensors file by tensor name, counted from its header.
std::map<std::string, int64_t> numels(const std::string& path) {
  io::SafetensorsFile f = io::SafetensorsFile::open(path);
  std::map<std::string, int64_t> result;
  for (const std::string& name : f.names()) result[name] = f.info(name).shape.numel();
  return result;
}

int64_t total(const std::map<std::string, int64_t>& counts) {
  int64_t sum = 0;
  for (const auto& [name, n] : counts) sum += n;
  return sum;
}

class CudaRecipeTest : public recipe_testing::TinyModelRecipeTest {
 protected:
  // The attention kernels these runs take: the environment's KTUNE_CUDA_ATTENTION when it names one
  // (to test another path), else gemm. Not auto, the recipes' default, which times the kernels on the
  // device and takes the fastest: runs that compare digit for digit (two GPUs against one, a resume
  // against the run it resumes) would depend on the timings. KTUNE_CUDA_ATTENTION=auto has its own test.
  void SetUp() override {
    static const std::string pinned = [] {
      const char* v = std::getenv("KTUNE_CUDA_ATTENTION");
      return std::string(v && *v && std::string(v) != "auto" ? v : "gemm");
    }();
    setenv("KTUNE_CUDA_ATTENTION", pinned.c_str(), 1);
    TinyModelRecipeTest::SetUp();
  }
  Outcome run(const std::string& launcher, const std::string& recipe, const std::string& config,
              const std::string& device, const std::string& extra, const std::string& output) {
    return run_tiny(launcher, recipe, config, "dtype=bf16 device=" + device + " " + extra, output);
  }
  static bool gpu() { return train::cuda_devices_visible() > 0; }

  // The single-device `kind` ("lora" or "full") recipe with ARGS on the CPU into out("cpu"), then on
  // the GPU into out("gpu"); both must succeed (a fatal failure otherwise). gpu: that run's outcome.
  void run_on_both(const std::string& kind, const std::string& args, Outcome* gpu_run = nullptr) {
    const std::string recipe = kind + "_finetune_single_device", config = kind + "_single_device";
    Outcome cpu = run("", recipe, config, "cpu", args, out("cpu"));
    Outcome gpu = run("", recipe, config, "cuda", args, out("gpu"));
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
    if (gpu_run) *gpu_run = gpu;
  }
  // `metric` logged `steps` times by both runs, the GPU's within `relative` of the CPU's each time.
  void expect_metric_tracks(const std::string& name, size_t steps, double relative) {
    const std::map<int, double> cpu = metric(out("cpu"), name), gpu = metric(out("gpu"), name);
    ASSERT_EQ(cpu.size(), steps) << name;
    ASSERT_EQ(gpu.size(), steps) << name;
    for (const auto& [step, value] : cpu) EXPECT_NEAR(gpu.at(step), value, relative * value) << name << ", step " << step;
  }
  // The run of out(`from`) again into out(`to`), resumed from the former's step_2 checkpoint.
  Outcome resume_from_step_2(const std::string& launcher, const std::string& recipe, const std::string& config,
                             const std::string& args, const std::string& from, const std::string& to) {
    fs::create_directories(out(to));
    fs::copy(out(from) + "/step_2", out(to) + "/step_2", fs::copy_options::recursive);
    return run(launcher, recipe, config, "cuda", args + " resume_from_checkpoint=True", out(to));
  }
  // lora_finetune_distributed on two GPUs, its frozen base sharded, against replicated (below).
  void expect_base_sharded_equals_replicated(const std::string& overrides, const std::string& pieces);
  std::string copy_of_model(const std::string& from, const std::string& name, DType dtype) {
    return recipe_testing::copy_of_model(from, out(name), dtype);
  }
  // out("bf16_model"): the tiny model with its f32 values rounded to bf16 (as a bf16 load rounds them).
  std::string bf16_copy_of_model() { return copy_of_model(model(), "bf16_model", DType::BF16); }
  // Two two-GPU runs of `recipe` (config `config`, two steps, `extra` arguments): from the tiny f32
  // model into out("f32") and from its bf16 copy (bf16_copy_of_model) into out("bf16").
  struct FromF32AndBf16 {
    Outcome f32, bf16;
    std::string bf16_model;
  };
  FromF32AndBf16 run_from_f32_and_bf16(const std::string& recipe, const std::string& config,
                                       const std::string& extra = "") {
    FromF32AndBf16 runs;
    runs.bf16_model = bf16_copy_of_model();
    const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2" + extra;
    runs.f32 = run("--nproc_per_node 2 --standalone", recipe, config, "cuda", args, out("f32"));
    runs.bf16 = run("--nproc_per_node 2 --standalone", recipe, config, "cuda",
                    args + " checkpointer.checkpoint_dir=" + runs.bf16_model, out("bf16"));
    return runs;
  }
  // The line in which `rank` ("[rank1]") says how many of the checkpoint's `total` bytes it mapped.
  static std::string mapped_line(const std::string& rank, const std::string& checkpoint_dir, const std::string& mapped,
                                 const std::string& total) {
    return rank + " INFO: " + checkpoint_dir + ": values mapped from the checkpoint files, not copied: " + mapped + " of " +
           total + " bytes";
  }
  struct ModelBytes {
    int64_t bf16 = 0, f32 = 0;
  };
  // Both runs succeeded, and both ranks mapped every byte of both checkpoints: the bf16 copy's as
  // bf16, the f32 model's as f32 read as bf16 (no bf16 copy of it on every rank). Returns the
  // model's bytes in either dtype.
  ModelBytes expect_both_ranks_mapped(const FromF32AndBf16& runs) {
    EXPECT_EQ(runs.f32.exit_code, 0) << runs.f32.output;
    EXPECT_EQ(runs.bf16.exit_code, 0) << runs.bf16.output;
    const int64_t numel = total(numels(model() + "/model.safetensors"));
    const ModelBytes bytes{2 * numel, 4 * numel};
    const std::string bf16 = std::to_string(bytes.bf16), f32 = std::to_string(bytes.f32);
    for (const std::string rank : {"[rank0]", "[rank1]"}) {
      EXPECT_NE(runs.bf16.output.find(mapped_line(rank, runs.bf16_model, bf16, bf16) + "\n"), std::string::npos)
          << runs.bf16.output;
      EXPECT_NE(runs.f32.output.find(mapped_line(rank, model(), f32, f32) +
                                     " (some held in the files' dtype, read as bf16)\n"),
                std::string::npos)
          << runs.f32.output;
    }
    return bytes;
  }
  // out(`a`) and out(`b`) logged the same two losses digit for digit and wrote the same epoch_0
  // checkpoint byte for byte.
  void expect_two_step_runs_equal(const std::string& a, const std::string& b) {
    ASSERT_EQ(losses(out(a)).size(), 2u);
    EXPECT_EQ(recipe_testing::logged(out(a)), recipe_testing::logged(out(b)));
    const std::map<std::string, std::string> files = recipe_testing::safetensors_bytes(out(a) + "/epoch_0");
    EXPECT_FALSE(files.empty());
    EXPECT_TRUE(files == recipe_testing::safetensors_bytes(out(b) + "/epoch_0"))
        << "the " << a << " run's checkpoint is not the " << b << " run's byte for byte";
  }
  // The tensors (names, shapes) of FILE in both runs' epoch_0.
  void expect_same_layout(const std::string& file) {
    EXPECT_EQ(layout(out("gpu") + "/epoch_0/" + file), layout(out("cpu") + "/epoch_0/" + file)) << file;
  }
};

}  // namespace

TEST_F(CudaRecipeTest, WithoutAGpuDeviceCudaTrainsOnTheCpuSayingWhy) {
  if (gpu()) GTEST_SKIP() << "a GPU is visible: device=cuda runs on it (the other tests here)";
  Outcome r = run("", "lora_finetune_single_device", "lora_single_device", "cuda", "epochs=1 max_steps_per_epoch=2", out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find(train::cuda_backend_built() ? "no GPU is visible" : "no CUDA backend"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("training on the CPU"), std::string::npos) << r.output;
  EXPECT_EQ(losses(out()).size(), 2u);
}

TEST_F(CudaRecipeTest, LoraOnTheGpuTracksTheCpuRunAndWritesTheSameAdapter) {
  SKIP_WITHOUT_GPUS(1);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 " + sized(8, 8), &gpu));
  EXPECT_NE(gpu.output.find("training on the GPU"), std::string::npos) << gpu.output;
  EXPECT_NE(gpu.output.find("planned device memory"), std::string::npos) << gpu.output;
  EXPECT_NE(gpu.output.find("attention kernels: " + std::string(std::getenv("KTUNE_CUDA_ATTENTION")) +
                            " (as set: KTUNE_CUDA_ATTENTION; not timed)"),
            std::string::npos)
      << gpu.output;
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  expect_same_layout("adapter_model.safetensors");
  EXPECT_TRUE(fs::exists(out("gpu") + "/epoch_0/adapter_config.json"));
  EXPECT_NO_THROW(model::Decoder::from_pretrained(out("gpu") + "/epoch_0"));  // the merged model
}

// 64 alpaca rows into `file`: row i asks to reverse a list of digits_of_row(i) digits.
std::string rows_to_reverse(const fs::path& file, const std::string& instruction,
                            const std::function<int(int)>& digits_of_row) {
  std::ofstream f(file);
  for (int i = 0; i < 64; ++i) {
    std::string input, output;
    const int n = digits_of_row(i);
    for (int d = 0; d < n; ++d) input += (d ? ", " : "") + std::to_string((i + d * 3) % 10);
    for (int d = n - 1; d >= 0; --d) output += (d < n - 1 ? ", " : "") + std::to_string((i + d * 3) % 10);
    f << "{\"instruction\": \"" << instruction << "\", \"input\": \"" << input << "\", \"output\": \"" << output
      << "\"}\n";
  }
  return file.string();
}

// Rows of 1 to 16 digits to reverse (the quickstart's rows are all about one length): consecutive
// batches have different longest rows, so steps run shorter than the plan.
std::string rows_of_varied_length(const fs::path& dir) {
  return rows_to_reverse(dir / "varied.jsonl", "Reverse the list.", [](int i) { return 1 + (i * 7) % 16; });
}

// torchtune's enable_activation_checkpointing and enable_activation_offloading on the GPU step (one
// layer's activations, recomputed; the kept layer inputs to pinned host memory and back) track the
// CPU run as closely as without them; and every batch is laid into its own length, rounded up to a
// multiple of kGpuSeqLenMultiple, not into the dataset's longest sample: the steps compute fewer
// positions than (batch_size, planned T) a step would.
TEST_F(CudaRecipeTest, LoraOnTheGpuWithActivationCheckpointingAndOffloadingTracksTheCpuRunOnEachBatchsLength) {
  SKIP_WITHOUT_GPUS(1);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 enable_activation_checkpointing=True enable_activation_offloading=True " +
                                                  sized(8, 8) + " dataset.data_files=" + rows_of_varied_length(dir_),
                                      &gpu));
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  EXPECT_NE(gpu.output.find("recomputes the layer's forward"), std::string::npos) << gpu.output;
  EXPECT_NE(gpu.output.find("checkpointed: each layer's input kept"), std::string::npos) << gpu.output;
  EXPECT_NE(gpu.output.find("offloaded: the layer inputs in two slots"), std::string::npos) << gpu.output;
  EXPECT_NE(gpu.output.find("pinned host memory for offloaded layer inputs"), std::string::npos) << gpu.output;
  std::smatch planned, computed;
  ASSERT_TRUE(std::regex_search(gpu.output, planned, std::regex("memory planned for \\((\\d+), (\\d+)\\)")))
      << gpu.output;
  ASSERT_TRUE(std::regex_search(gpu.output, computed, std::regex("the training steps computed (\\d+) positions")))
      << gpu.output;
  const int64_t per_step = std::stoll(planned[1]) * std::stoll(planned[2]);
  EXPECT_LT(std::stoll(computed[1]), steps(8) * per_step) << gpu.output;
}

// Unpacked batches on the GPU are padding-free unless KTUNE_PADDING_FREE=0: each batch's samples
// re-laid into as few rows of its T as first-fit finds, each sample its own document (positions from
// 0, attention inside it), the step run on those rows only. The data in order, a long sample then
// three short ones (batch 4 even on the emulated step): the first batch is three rows, two short
// samples in one. The first step (the same weights in every run) is the padded step's: its loss and
// gradient norm equal the same GPU run's with KTUNE_PADDING_FREE=0 (bit for bit on the emulated step,
// where the two short samples seeing each other moved the loss by 3e-4 and the norm by 4e-3; on a
// GPU within the bf16 noise of other GEMM shapes) and the CPU run's within 0.1%; the losses track the
// CPU run's, and the steps compute fewer positions than the collated batches hold, and than the
// padded run.
std::string one_long_then_three_short(const fs::path& dir) {
  return rows_to_reverse(dir / "long_and_short.jsonl", "Reverse.", [](int i) { return i % 4 == 0 ? 16 : 1; });
}

TEST_F(CudaRecipeTest, LoraOnTheGpuLaysPaddedBatchesIntoFewerRowsAndTracksTheCpuRun) {
  SKIP_WITHOUT_GPUS(1);
  const std::string args = "epochs=1 shuffle=False max_steps_per_epoch=" + std::to_string(steps(8)) +
                           " batch_size=4 dataset.data_files=" + one_long_then_three_short(dir_);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", args, &gpu));
  setenv("KTUNE_PADDING_FREE", "0", 1);
  const Outcome padded = run("", "lora_finetune_single_device", "lora_single_device", "cuda", args, out("gpu_padded"));
  unsetenv("KTUNE_PADDING_FREE");
  ASSERT_EQ(padded.exit_code, 0) << padded.output;
  EXPECT_NE(gpu.output.find("GPU step, padding-free (rows of at most T)"), std::string::npos) << gpu.output;
  EXPECT_NE(padded.output.find("GPU step (KTUNE_PADDING_FREE=0)"), std::string::npos) << padded.output;

  const std::regex counts("the training steps computed (\\d+) positions for (\\d+) sample tokens.*the batches hold (\\d+) ");
  std::smatch relaid_counts, padded_counts;
  ASSERT_TRUE(std::regex_search(gpu.output, relaid_counts, counts)) << gpu.output;
  ASSERT_TRUE(std::regex_search(padded.output, padded_counts, counts)) << padded.output;
  EXPECT_LT(std::stoll(relaid_counts[1]), std::stoll(relaid_counts[3])) << gpu.output;
  EXPECT_GE(std::stoll(relaid_counts[1]), std::stoll(relaid_counts[2])) << gpu.output;
  EXPECT_LT(std::stoll(relaid_counts[1]), std::stoll(padded_counts[1])) << padded.output;

  const double loss_tolerance = emulated() ? 1e-7 : 1e-3, norm_tolerance = emulated() ? 1e-7 : 1e-2;
  const std::map<int, double> relaid_norms = metric(out("gpu"), "grad_norm"), padded_norms = metric(out("gpu_padded"), "grad_norm");
  const std::map<int, double> relaid_losses = losses(out("gpu")), padded_losses = losses(out("gpu_padded"));
  ASSERT_FALSE(relaid_norms.empty());
  ASSERT_FALSE(padded_norms.empty());
  const double norm = padded_norms.begin()->second, loss = padded_losses.begin()->second;
  EXPECT_NEAR(relaid_norms.begin()->second, norm, norm_tolerance * norm) << "the first step's gradient norm";
  EXPECT_NEAR(relaid_losses.begin()->second, loss, loss_tolerance * loss) << "the first step's loss";
  const std::map<int, double> cpu_losses = losses(out("cpu"));
  EXPECT_NEAR(relaid_losses.begin()->second, cpu_losses.begin()->second, 1e-3 * cpu_losses.begin()->second);
  expect_tracks(cpu_losses, relaid_losses, 0.05);
}

// torchtune's dataset.packed: each pack's samples kept apart on the GPU step as on the CPU engine
// (positions restarting per sample, attention masked by doc ids), the step planned for packs of
// max_seq_len, and the losses tracking the CPU run's. The first step (the same weights on both
// engines) within 0.1%: on the emulated step, bf16 arithmetic alone left 0.01% there, while the step
// without doc ids (a pack's samples seeing each other) was 0.25% off, which 5% would not catch.
TEST_F(CudaRecipeTest, LoraOnTheGpuTrainsPackedSamplesAsTheCpuRunDoes) {
  SKIP_WITHOUT_GPUS(1);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(
      run_on_both("lora", "epochs=1 " + sized(8, 8) + " dataset.packed=True tokenizer.max_seq_len=128", &gpu));
  EXPECT_NE(gpu.output.find("training on the GPU"), std::string::npos) << gpu.output;
  std::smatch planned;
  ASSERT_TRUE(std::regex_search(gpu.output, planned, std::regex("memory planned for \\((\\d+), (\\d+)\\)")))
      << gpu.output;
  EXPECT_EQ(std::stoll(planned[2]), 128) << gpu.output;
  const std::map<int, double> cpu_losses = losses(out("cpu")), gpu_losses = losses(out("gpu"));
  ASSERT_FALSE(cpu_losses.empty());
  ASSERT_FALSE(gpu_losses.empty());
  const double first = cpu_losses.begin()->second;
  EXPECT_NEAR(gpu_losses.begin()->second, first, 1e-3 * first) << "the first step's loss";
  expect_tracks(cpu_losses, gpu_losses, 0.05);
  expect_same_layout("adapter_model.safetensors");
}

TEST_F(CudaRecipeTest, QloraOnTheGpuTracksTheCpuRun) {
  SKIP_WITHOUT_GPUS(1);
  // The same NF4 codes on both engines: the GPU step quantises with the CPU's quantiser.
  // The layers' NF4 GEMMs dequantise inside the GEMM here (q, k, v, o: their dims are multiples of
  // 64; the MLP's 352 is not and keeps the scratch); the lm_head case below runs the default path.
  setenv("KTUNE_CUDA_NF4_GEMM", "fused", 1);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 " + sized(8, 8) + " model.quantize_base=True", &gpu));
  unsetenv("KTUNE_CUDA_NF4_GEMM");
  EXPECT_NE(gpu.output.find("dequantised inside their GEMMs"), std::string::npos) << gpu.output;
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  expect_same_layout("adapter_model.safetensors");
}

TEST_F(CudaRecipeTest, AnUnknownNf4GemmModeIsRefusedNamingTheEnv) {
  SKIP_WITHOUT_GPUS(1);
  setenv("KTUNE_CUDA_NF4_GEMM", "fast", 1);
  const Outcome gpu = run("", "lora_finetune_single_device", "lora_single_device", "cuda",
                          "epochs=1 " + sized(2, 2) + " model.quantize_base=True", out("gpu"));
  unsetenv("KTUNE_CUDA_NF4_GEMM");
  EXPECT_NE(gpu.exit_code, 0);
  EXPECT_NE(gpu.output.find("KTUNE_CUDA_NF4_GEMM"), std::string::npos) << gpu.output;
}

// torchtune's apply_lora_to_output (its Mistral LoRA/QLoRA configs) on an untied copy of the tiny
// model: LoRA on lm_head inside the GPU step's fused loss, its base NF4 under QLoRA as on the CPU.
TEST_F(CudaRecipeTest, QloraOnTheOutputProjectionOnTheGpuTracksTheCpuRun) {
  SKIP_WITHOUT_GPUS(1);
  std::ifstream in(recipe_testing::kSource + "/examples/quickstart/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  config = std::regex_replace(config, std::regex("\"tie_word_embeddings\": true"), "\"tie_word_embeddings\": false");
  ASSERT_NE(config.find("\"tie_word_embeddings\": false"), std::string::npos);
  const std::string untied = out("untied_model");
  fs::create_directories(untied);
  std::ofstream(out("untied_config.json")) << config;
  const Outcome init = recipe_testing::sh(recipe_testing::kKtune + " init-model --config " + out("untied_config.json") +
                                          " --output-dir " + untied + " --seed 3");
  ASSERT_EQ(init.exit_code, 0) << init.output;
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 " + sized(8, 8) + " checkpointer.checkpoint_dir=" + untied +
                                                  " model.apply_lora_to_output=True model.quantize_base=True",
                                      &gpu));
  EXPECT_NE(gpu.output.find("training on the GPU"), std::string::npos) << gpu.output;
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  expect_same_layout("adapter_model.safetensors");
  EXPECT_EQ(layout(out("gpu") + "/epoch_0/adapter_model.safetensors").count("base_model.model.lm_head.lora_A.weight"), 1u);
}

TEST_F(CudaRecipeTest, LoraDropoutOnTheGpuTrainsAsTheCpuRunDoesInDistribution) {
  SKIP_WITHOUT_GPUS(1);
  // The engines lay batches out differently, so their masks differ (docs/cuda.md): each step's loss
  // within 10%, not 5%, and the loss falls on both.
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 " + sized(8, 8) + " model.lora_dropout=0.1"));
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.10);
}

TEST_F(CudaRecipeTest, DoraOnTheGpuTracksTheCpuRunAndSavesTheMagnitudes) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 " + sized(8, 8) + " model.use_dora=True"));
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  expect_same_layout("adapter_model.safetensors");  // with the lora_magnitude_vector of every adapter
}

TEST_F(CudaRecipeTest, ValidationOnTheGpuMatchesTheCpuRunsValidation) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_NO_FATAL_FAILURE(run_on_both(
      "lora", "epochs=1 max_steps_per_epoch=4 batch_size=8 run_val_every_n_steps=2 "
              "dataset_val._component_=torchtune.datasets.alpaca_dataset dataset_val.source=json "
              "dataset_val.data_files=" + recipe_testing::kSource + "/data/quickstart/jsonl/validation.jsonl"));
  expect_metric_tracks("val_loss", 2, 0.05);
}

TEST_F(CudaRecipeTest, FullFinetuneOnTheGpuTracksTheCpuRun) {
  SKIP_WITHOUT_GPUS(1);
  ASSERT_NO_FATAL_FAILURE(run_on_both("full", "epochs=1 " + sized(8, 8) + " clip_grad_norm=1.0"));
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
  expect_metric_tracks("grad_norm", size_t(steps(8)), 0.10);
  expect_same_layout("model-00001-of-00001.safetensors");
}

// KTUNE_CUDA_ATTENTION=auto (the recipes' default): before training, every attention kernel runs one
// layer's forward and backward at the planned shape on the GPU, on rows of documents as long as the
// samples on average (the steps' rows are padding-free: several samples a row); they agree with each
// other, and the step takes the fastest of them (its line in the log), then trains as the CPU run does.
TEST_F(CudaRecipeTest, LoraOnTheGpuTimesTheAttentionKernelsAndTakesTheFastestThatAgrees) {
  SKIP_WITHOUT_GPUS(1);
  setenv("KTUNE_CUDA_ATTENTION", "auto", 1);
  Outcome gpu;
  ASSERT_NO_FATAL_FAILURE(run_on_both("lora", "epochs=1 max_steps_per_epoch=2 batch_size=2", &gpu));
  const size_t line = gpu.output.find("attention kernels timed (forward + backward of one layer");
  ASSERT_NE(line, std::string::npos) << gpu.output;
  const std::string timed = gpu.output.substr(line, gpu.output.find('\n', line) - line);
  // padding-free rows hold several samples: the trials' rows hold documents of the samples' mean length
  EXPECT_NE(timed.find(", rows of documents of "), std::string::npos) << timed;
  EXPECT_NE(timed.find(" tokens): gemm "), std::string::npos) << timed;
  // the tiny model's head_dim (32) leaves the fused kernel out: the GEMM path and the tiled kernel
  EXPECT_NE(timed.find(", flash "), std::string::npos) << timed;
  EXPECT_EQ(timed.find("left out"), std::string::npos) << timed;
  EXPECT_TRUE(timed.find("; chose gemm") != std::string::npos || timed.find("; chose flash") != std::string::npos)
      << timed;
  expect_tracks(losses(out("cpu")), losses(out("gpu")), 0.05);
}

TEST_F(CudaRecipeTest, AGpuRunResumesFromAMidEpochCheckpoint) {
  SKIP_WITHOUT_GPUS(1);
  const std::string args = "epochs=2 " + sized(4, 4) + " save_every_n_steps=2";
  Outcome whole = run("", "lora_finetune_single_device", "lora_single_device", "cuda", args, out("a"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  Outcome resumed = resume_from_step_2("", "lora_finetune_single_device", "lora_single_device", args, "a", "b");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto a = losses(out("a"));
  auto b = losses(out("b"));
  ASSERT_EQ(a.size(), size_t(2 * steps(4)));
  ASSERT_EQ(b.size(), size_t(2 * steps(4) - 2));  // steps 3 to the end
  // The state round-trips exactly (bf16 weights and moments, the step count, the rounding seeds);
  // what may differ is the order of the GPU's atomic additions.
  for (const auto& [step, loss] : b) EXPECT_NEAR(loss, a.at(step), 1e-2 * a.at(step)) << "step " << step;
}

// LoRA on two GPUs (lora_finetune_distributed): by default the AdamW state sharded (ZeRO-1) and the
// layers' frozen base too (each GPU stores its piece of each layer's, gathered before the layer's
// forward and backward; under QLoRA the NF4 codes and scales with it), against replicated GPUs
// (KTUNE_DATA_PARALLEL=replicate: the base whole on each): the same losses digit for digit and the
// same checkpoint byte for byte. Two steps. `overrides` adds to the run's (QLoRA's quantize_base);
// `pieces` is what the decoder's memory report says the pieces hold.
void CudaRecipeTest::expect_base_sharded_equals_replicated(const std::string& overrides, const std::string& pieces) {
  const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2" + overrides;
  Outcome sharded = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", "cuda",
                        args, out("sharded"));
  setenv("KTUNE_DATA_PARALLEL", "replicate", 1);
  Outcome replicated = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device",
                           "cuda", args, out("replicated"));
  unsetenv("KTUNE_DATA_PARALLEL");
  ASSERT_EQ(sharded.exit_code, 0) << sharded.output;
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  // Each rank's host model once the GPUs hold the weights, against the files' counts: rank 0 keeps
  // the frozen base (the f32 file's mapped values, read as bf16; QLoRA's too: its adapters hold no
  // NF4 codes, a save makes those of each projection it merges) and the f32 adapters, for its saves;
  // rank 1 no values; no NF4 bases and no gradients anywhere.
  const bool quantized = overrides.find("quantize_base=True") != std::string::npos;
  const std::map<std::string, int64_t> base = numels(model() + "/model.safetensors");
  const std::map<std::string, int64_t> adapter = numels(out("sharded") + "/epoch_0/adapter_model.safetensors");
  const int64_t base_bytes = 4 * total(base);
  ASSERT_GT(total(adapter), 0);
  for (const Outcome* r : {&sharded, &replicated}) {
    const HostHeld rank0 = host_held(r->output, 0), rank1 = host_held(r->output, 1);
    EXPECT_EQ(rank0.values, base_bytes + 4 * total(adapter)) << r->output;
    EXPECT_EQ(rank1.values, 0) << r->output;
    EXPECT_EQ(rank0.gradients, 0) << r->output;
    EXPECT_EQ(rank1.gradients, 0) << r->output;
    EXPECT_EQ(rank0.nf4, 0) << r->output;
    EXPECT_EQ(rank1.nf4, 0) << r->output;
    EXPECT_EQ(rank0.nf4_made_at_save, quantized) << r->output;
    EXPECT_FALSE(rank1.nf4_made_at_save) << r->output;
  }
  EXPECT_NE(sharded.output.find("the layers' frozen bf16 base weights (ZeRO-3"), std::string::npos) << sharded.output;
  EXPECT_NE(sharded.output.find("weights sharded (ZeRO-3): this GPU's pieces of the layers' " + pieces),
            std::string::npos)
      << sharded.output;
  EXPECT_EQ(replicated.output.find("weights sharded (ZeRO-3)"), std::string::npos) << replicated.output;
  expect_two_step_runs_equal("sharded", "replicated");
}

TEST_F(CudaRecipeTest, TwoGpusLoraShardTheFrozenBaseAndEqualReplicated) {
  SKIP_WITHOUT_GPUS(2);
  expect_base_sharded_equals_replicated("", "frozen bf16 base");
}

TEST_F(CudaRecipeTest, TwoGpusQloraShardTheFrozenBaseWithItsNf4CodesAndEqualReplicated) {
  SKIP_WITHOUT_GPUS(2);
  expect_base_sharded_equals_replicated(" model.quantize_base=True", "frozen bf16 base weights and NF4 codes and scales");
}

// The ranks of a GPU full fine-tune map the checkpoint's values rather than copy them, and keep none
// once the GPUs hold them (rank 0's saves stream the trained values from the GPUs): both ranks map
// every byte of a bf16 copy of the tiny model, and every byte of the f32 model itself (as f32, read
// as bf16: Gemma 2's f32 checkpoints, no bf16 copy of the model on every rank). Both runs (ZeRO-3,
// two steps) log the same losses digit for digit and write the same checkpoint byte for byte.
TEST_F(CudaRecipeTest, TwoGpusFullFinetuneRanksMapTheCheckpointInItsDtypeKeepNoValuesAndTrainAlike) {
  SKIP_WITHOUT_GPUS(2);
  const FromF32AndBf16 runs = run_from_f32_and_bf16("full_finetune_distributed", "full_single_device");
  expect_both_ranks_mapped(runs);
  for (const Outcome* r : {&runs.bf16, &runs.f32})
    for (int rank : {0, 1}) EXPECT_EQ(host_held(r->output, rank).values, 0) << r->output;
  EXPECT_NE(runs.f32.output.find("rank 0: no values, a save streams the trained ones from the GPUs"), std::string::npos)
      << runs.f32.output;
  expect_two_step_runs_equal("bf16", "f32");
}

// Rank 0 of a LoRA run maps the checkpoint's values too: they are all frozen, kept only for its saves
// to merge into, so their pages are dropped once uploaded and read again from the file by a save.
// Both ranks map every byte of the bf16 copy of the tiny model and of the f32 model (as f32, read as
// bf16), and rank 0 keeps them mapped (its host line counts them: the f32 base twice the bf16's bytes).
// Both runs (two steps, the frozen base sharded) log the same losses digit for digit and write the
// same checkpoint byte for byte: the merged model made of the f32 base read as bf16 is the bf16 one's.
TEST_F(CudaRecipeTest, TwoGpusLoraRankZeroKeepsItsFrozenBaseMappedAndSavesAlikeFromF32OrBf16) {
  SKIP_WITHOUT_GPUS(2);
  const FromF32AndBf16 runs = run_from_f32_and_bf16("lora_finetune_distributed", "lora_single_device");
  const ModelBytes base = expect_both_ranks_mapped(runs);
  // Rank 0 holds the base (mapped) and the adapters; its host line counts the mapped bytes.
  const HostHeld bf16_0 = host_held(runs.bf16.output, 0), f32_0 = host_held(runs.f32.output, 0);
  EXPECT_GT(bf16_0.values, base.bf16) << runs.bf16.output;
  EXPECT_EQ(f32_0.values - bf16_0.values, base.f32 - base.bf16) << runs.bf16.output << runs.f32.output;
  EXPECT_NE(runs.bf16.output.find("; " + std::to_string(base.bf16) + " bytes of the values ("), std::string::npos)
      << runs.bf16.output;
  EXPECT_NE(runs.f32.output.find("; " + std::to_string(base.f32) + " bytes of the values ("), std::string::npos)
      << runs.f32.output;
  for (const Outcome* r : {&runs.bf16, &runs.f32}) EXPECT_EQ(host_held(r->output, 1).values, 0) << r->output;
  expect_two_step_runs_equal("bf16", "f32");
}

// QLoRA (and DoRA) on GPUs keep the base bf16 on the host, as the GPUs do, instead of the f32 the
// CPU engine computes on, and QLoRA's adapters hold no NF4 codes (the GPUs quantise their own copy; a
// save makes the codes of each projection it merges): both ranks map every byte of the bf16 copy of
// the tiny model and of the f32 model (no f32 or bf16 copy of the model at load on every rank, 280 or
// 140 GB a rank at 70B before, nor its codes, 39 GB), and rank 0 keeps the whole base mapped, its
// pages dropped until a save; the f32 base is quantised as its bf16 rounding. Both runs (two steps,
// the base sharded, DoRA on top of QLoRA) log the same losses digit for digit and write the same
// checkpoint byte for byte.
TEST_F(CudaRecipeTest, TwoGpusQloraRanksMapTheCheckpointInItsDtypeAndTrainAlikeFromF32OrBf16) {
  SKIP_WITHOUT_GPUS(2);
  const FromF32AndBf16 runs = run_from_f32_and_bf16("lora_finetune_distributed", "lora_single_device",
                                                    " model.quantize_base=True model.use_dora=True");
  const ModelBytes base = expect_both_ranks_mapped(runs);
  const HostHeld bf16_0 = host_held(runs.bf16.output, 0), f32_0 = host_held(runs.f32.output, 0);
  EXPECT_GT(bf16_0.values, base.bf16) << runs.bf16.output;  // the base and the adapters
  EXPECT_EQ(f32_0.values - bf16_0.values, base.f32 - base.bf16) << runs.bf16.output << runs.f32.output;
  EXPECT_NE(runs.bf16.output.find("; " + std::to_string(base.bf16) + " bytes of the values ("), std::string::npos)
      << runs.bf16.output;
  for (const Outcome* r : {&runs.bf16, &runs.f32}) {
    EXPECT_EQ(host_held(r->output, 0).nf4, 0) << r->output;
    EXPECT_TRUE(host_held(r->output, 0).nf4_made_at_save) << r->output;
    EXPECT_EQ(host_held(r->output, 1).nf4, 0) << r->output;
    EXPECT_EQ(host_held(r->output, 1).values, 0) << r->output;
  }
  expect_two_step_runs_equal("bf16", "f32");
}

// Some checkpoints hold f16 (a GPU run keeps bf16): the ranks map the f16 files as they are (no bf16
// copy of the model on every rank) and read them as the bf16 copy would hold them, so LoRA, and
// QLoRA + DoRA (the quantiser, the magnitudes and the merge reading the f16 base a chunk at a time),
// train from an f16 model as from its bf16 rounding: the same losses digit for digit and the same
// checkpoint byte for byte (two GPUs, two steps, the base sharded).
TEST_F(CudaRecipeTest, TwoGpusLoraAndQloraMapAnF16CheckpointAndTrainAsFromItsBf16Rounding) {
  SKIP_WITHOUT_GPUS(2);
  const std::string f16_model = copy_of_model(model(), "f16_model", DType::F16);
  const std::string bf16_model = copy_of_model(f16_model, "bf16_of_f16_model", DType::BF16);
  const std::string bytes = std::to_string(2 * total(numels(model() + "/model.safetensors")));
  for (const std::string extra : {"", " model.quantize_base=True model.use_dora=True"}) {
    SCOPED_TRACE("extra arguments:" + extra);
    const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2" + extra;
    fs::remove_all(out("f16"));
    fs::remove_all(out("bf16"));
    Outcome f16 = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", "cuda",
                      args + " checkpointer.checkpoint_dir=" + f16_model, out("f16"));
    Outcome bf16 = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", "cuda",
                       args + " checkpointer.checkpoint_dir=" + bf16_model, out("bf16"));
    ASSERT_EQ(f16.exit_code, 0) << f16.output;
    ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
    for (const std::string rank : {"[rank0]", "[rank1]"})
      EXPECT_NE(f16.output.find(mapped_line(rank, f16_model, bytes, bytes) +
                                " (some held in the files' dtype, read as bf16)\n"),
                std::string::npos)
          << f16.output;
    expect_two_step_runs_equal("bf16", "f16");
  }
}

// save_adapter_weights_only: no merged model is written, so rank 0's host model keeps the adapters
// alone (the file's count of them, f32) once the GPUs hold the weights, rank 1's nothing, and rank 0
// still saves the adapters it downloads into (two steps, then the epoch's checkpoint).
TEST_F(CudaRecipeTest, TwoGpusLoraSavingAdapterWeightsOnlyKeepOnlyTheAdaptersOnRankZero) {
  SKIP_WITHOUT_GPUS(2);
  Outcome r = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", "cuda",
                  "epochs=1 max_steps_per_epoch=2 batch_size=2 save_adapter_weights_only=True", out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(losses(out()).size(), 2u);
  const std::string adapter_file = out() + "/epoch_0/adapter_model.safetensors";
  ASSERT_TRUE(fs::exists(adapter_file)) << r.output;
  EXPECT_FALSE(fs::exists(out() + "/epoch_0/model.safetensors.index.json")) << "a merged model was written";
  const HostHeld rank0 = host_held(r.output, 0), rank1 = host_held(r.output, 1);
  EXPECT_EQ(rank0.values, 4 * total(numels(adapter_file))) << r.output;
  EXPECT_EQ(rank1.values, 0) << r.output;
  EXPECT_EQ(rank0.gradients, 0) << r.output;
  EXPECT_EQ(rank1.gradients, 0) << r.output;
}

// KTUNE_CUDA_ATTENTION=auto over two GPUs: every GPU times the kernels, the trials are all-gathered,
// and both take the same kernel from the same figures (the mean time, the largest difference): the two
// ranks log one line, word for word, naming both GPUs.
TEST_F(CudaRecipeTest, TwoGpusTimeTheAttentionKernelsTogetherAndTakeTheSameOne) {
  SKIP_WITHOUT_GPUS(2);
  setenv("KTUNE_CUDA_ATTENTION", "auto", 1);
  Outcome r = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", "cuda",
                  "epochs=1 max_steps_per_epoch=2 batch_size=2", out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(losses(out()).size(), 2u);
  auto line_of = [&r](const std::string& rank) {
    const std::string start = rank + " INFO: attention kernels timed (forward + backward of one layer";
    const size_t at = r.output.find(start);
    return at == std::string::npos ? std::string()
                                   : r.output.substr(at + start.size(), r.output.find('\n', at) - at - start.size());
  };
  const std::string rank0 = line_of("[rank0]"), rank1 = line_of("[rank1]");
  ASSERT_FALSE(rank0.empty()) << r.output;
  EXPECT_EQ(rank0, rank1);
  EXPECT_NE(rank0.find(" (over 2 GPUs: mean times, largest differences)"), std::string::npos) << rank0;
  EXPECT_EQ(rank0.find("left out"), std::string::npos) << rank0;
}

// KTUNE_ZERO3_PREFETCH=0: a ZeRO-3 full fine-tune over two GPUs with one weight slot (each layer
// gathered as it computes, nothing prefetched) logs the default run's losses digit for digit and
// writes its checkpoint byte for byte, and its memory report says so; a value other than 0 or 1 is
// refused, naming the variable, before anything trains.
TEST_F(CudaRecipeTest, TwoGpusZero3WithoutPrefetchTrainAndSaveAsWithIt) {
  SKIP_WITHOUT_GPUS(2);
  const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2";
  Outcome prefetched = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device",
                           "cuda", args, out("prefetched"));
  setenv("KTUNE_ZERO3_PREFETCH", "0", 1);
  Outcome one_slot = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device", "cuda",
                         args, out("one_slot"));
  setenv("KTUNE_ZERO3_PREFETCH", "yes", 1);
  Outcome refused = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device", "cuda",
                        args, out("refused"));
  unsetenv("KTUNE_ZERO3_PREFETCH");
  ASSERT_EQ(prefetched.exit_code, 0) << prefetched.output;
  ASSERT_EQ(one_slot.exit_code, 0) << one_slot.output;
  EXPECT_NE(prefetched.output.find("two layers' gather slots (one computes, one prefetches)"), std::string::npos)
      << prefetched.output;
  EXPECT_NE(one_slot.output.find("one layer's gather slot (no prefetch"), std::string::npos) << one_slot.output;
  expect_two_step_runs_equal("one_slot", "prefetched");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("KTUNE_ZERO3_PREFETCH"), std::string::npos) << refused.output;
  EXPECT_TRUE(!fs::exists(out("refused") + "/logs") || losses(out("refused")).empty()) << "a step ran";
}

// Two GPUs (a worker each, over NCCL; on the emulated step each worker its own emulated device and
// fake/nccl.h between them) with the AdamW state, the gradients and the layers' weights sharded
// (ZeRO-3), the default: every step's loss that of one GPU with the doubled batch. ZeRO-2
// (fsdp_reshard_after_forward=False, like KTUNE_DATA_PARALLEL=zero2: the weights whole) and replicated (KTUNE_DATA_PARALLEL=replicate) give
// the same losses digit for digit: two gradients sum alike either way, and the sharded step rounds as
// the whole one does; ZeRO-2 writes the same checkpoints byte for byte (ZeRO-3's layers gathered on
// every GPU for rank 0 to save). A ZeRO-3 run resumed from its step-2 checkpoint (the weights back
// into each GPU's pieces, the moments gathered to rank 0 under the unsharded names, each GPU taking
// its slice back) continues as the uninterrupted run.
TEST_F(CudaRecipeTest, TwoGpusOverNcclEqualOneWithTheDoubledBatchShardedOrReplicatedAndResume) {
  SKIP_WITHOUT_GPUS(2);
  // 4 steps even on the emulated step: the resumed run's step 4 is the first that reads the moments.
  const std::string args = "epochs=1 save_every_n_steps=2 max_steps_per_epoch=4";
  Outcome one = run("", "full_finetune_distributed", "full_single_device", "cuda", args + " batch_size=4", out("one"));
  Outcome two = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device", "cuda",
                    args + " batch_size=2", out("two"));
  setenv("KTUNE_DATA_PARALLEL", "replicate", 1);
  Outcome replicated = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device",
                           "cuda", args + " batch_size=2", out("replicated"));
  unsetenv("KTUNE_DATA_PARALLEL");
  Outcome zero2 = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device", "cuda",
                      args + " batch_size=2 fsdp_reshard_after_forward=False", out("zero2"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  ASSERT_EQ(replicated.exit_code, 0) << replicated.output;
  ASSERT_EQ(zero2.exit_code, 0) << zero2.output;
  EXPECT_NE(two.output.find("AdamW state sharded"), std::string::npos) << two.output;
  // A full fine-tune shards its gradients and its layers' weights too (ZeRO-3): the weights gathered
  // layer by layer, the gradients reduced layer by layer as the backward goes.
  EXPECT_NE(two.output.find("the gradients and the layers' weights (ZeRO-3"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("gradients sharded (ZeRO-2)"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("weights sharded (ZeRO-3)"), std::string::npos) << two.output;
  EXPECT_NE(zero2.output.find("and the gradients too (ZeRO-2"), std::string::npos) << zero2.output;
  EXPECT_NE(zero2.output.find("fsdp_reshard_after_forward=False: the layers' weights stay whole"), std::string::npos)
      << zero2.output;
  EXPECT_EQ(zero2.output.find("weights sharded (ZeRO-3)"), std::string::npos) << zero2.output;
  EXPECT_NE(replicated.output.find("replicated over 2 GPUs"), std::string::npos) << replicated.output;
  // Once the GPUs hold the weights, no rank's host model keeps values (rank 0's saves stream them from
  // the GPUs, ZeRO-3's layers gathered unit by unit as they are written) nor gradients.
  for (const Outcome* r : {&two, &replicated, &zero2}) {
    const HostHeld rank0 = host_held(r->output, 0), rank1 = host_held(r->output, 1);
    EXPECT_EQ(rank0.values, 0) << r->output;
    EXPECT_EQ(rank1.values, 0) << r->output;
    EXPECT_EQ(rank0.gradients, 0) << r->output;
    EXPECT_EQ(rank1.gradients, 0) << r->output;
  }
  auto l1 = losses(out("one"));
  auto l2 = losses(out("two"));
  ASSERT_EQ(l1.size(), 4u);
  ASSERT_EQ(l2.size(), 4u);
  for (const auto& [step, loss] : l1) EXPECT_NEAR(l2.at(step), loss, 2e-2 * loss) << "step " << step;
  EXPECT_EQ(recipe_testing::logged(out("replicated")), recipe_testing::logged(out("two")));
  EXPECT_EQ(recipe_testing::logged(out("zero2")), recipe_testing::logged(out("two")));
  for (const std::string checkpoint : {"/step_2", "/epoch_0"}) {
    const std::map<std::string, std::string> zero3_files = recipe_testing::safetensors_bytes(out("two") + checkpoint);
    EXPECT_FALSE(zero3_files.empty()) << checkpoint;
    EXPECT_TRUE(zero3_files == recipe_testing::safetensors_bytes(out("zero2") + checkpoint))
        << checkpoint << ": the ZeRO-3 run's checkpoint is not the ZeRO-2 run's byte for byte";
  }

  Outcome resumed = resume_from_step_2("--nproc_per_node 2 --standalone", "full_finetune_distributed",
                                       "full_single_device", args + " batch_size=2", "two", "resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto lr = losses(out("resumed"));
  ASSERT_EQ(lr.size(), 2u);  // steps 3 and 4
  for (const auto& [step, loss] : lr) EXPECT_NEAR(loss, l2.at(step), 1e-2 * l2.at(step)) << "step " << step;
  if (emulated()) {  // no atomics racing on the emulated step: digit for digit
    std::map<int, std::string> whole = recipe_testing::logged(out("two"));
    whole.erase(1), whole.erase(2);
    EXPECT_EQ(recipe_testing::logged(out("resumed")), whole);
  }
}
