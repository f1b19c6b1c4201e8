// The recipes end to end, through `ktune run` as a user (or the Kubeflow runtime) calls it.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "kernels/cpu/nf4.h"
#include "model/decoder.h"
#include "tiny_recipe_run.h"

namespace fs = std::filesystem;
using namespace ktune;
using recipe_testing::kKtune;
using recipe_testing::kSource;
using recipe_testing::losses;
using recipe_testing::Outcome;
using recipe_testing::sh;

namespace {

// The quickstart's tiny model per test, runs in fp32 unless a test says otherwise.
class RecipeTest : public recipe_testing::TinyModelRecipeTest {
 protected:
  Outcome run(const std::string& launcher, const std::string& recipe, const std::string& config, const std::string& extra,
              const std::string& output) {
    return run_tiny(launcher, recipe, config, "dtype=fp32 " + extra, output);
  }
};

}  // namespace

TEST_F(RecipeTest, FullFinetuneLossFallsAndWritesTorchtunesLayout) {
  Outcome r = run("", "full_finetune_single_device", "full_single_device", "epochs=2 max_steps_per_epoch=12 batch_size=8", out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = losses(out());
  ASSERT_EQ(l.size(), 24u);
  EXPECT_LT(l.rbegin()->second, 0.6 * l.begin()->second) << "loss " << l.begin()->second << " -> " << l.rbegin()->second;
  // lr logged as torchtune's recipes log it: read after the step's scheduler update, so step s shows
  // the warmup's s / 5 of 1e-3 (the lr of the update after it), never the 0 the first update used.
  const auto lr = losses(out(), "lr");
  for (int step = 1; step <= 4; ++step) EXPECT_NEAR(lr.at(step), 1e-3 * step / 5, 1e-12) << "step " << step;
  for (const char* f : {"epoch_0/model-00001-of-00001.safetensors", "epoch_1/model.safetensors.index.json",
                        "epoch_1/config.json", "epoch_1/tokenizer.json", "epoch_1/recipe_state/recipe_state.json"})
    EXPECT_TRUE(fs::exists(fs::path(out()) / f)) << f;
  // The merged model loads back into ktune.
  EXPECT_NO_THROW(model::Decoder::from_pretrained(out() + "/epoch_1"));
  // As torchtune's recipes: the resolved config in the log, and (DiskLogger's save_config) in
  // output_dir with the overrides applied and the interpolations as written, loadable as a config again.
  EXPECT_NE(r.output.find("Running full_finetune_single_device with resolved config:\n\nbatch_size: 8\n"),
            std::string::npos) << r.output;
  std::ifstream saved_file(out() + "/torchtune_config.yaml");
  const std::string saved((std::istreambuf_iterator<char>(saved_file)), {});
  for (const std::string& line : std::vector<std::string>{"batch_size: 8\n", "max_steps_per_epoch: 12\n", "epochs: 2\n",
                                  "output_dir: " + out() + "\n", "  log_dir: ${output_dir}/logs\n"})
    EXPECT_NE(saved.find(line), std::string::npos) << line << " not in\n" << saved;
  Outcome again = sh(kKtune + " validate " + out() + "/torchtune_config.yaml --recipe full_finetune_single_device");
  EXPECT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("Config is well-formed!"), std::string::npos) << again.output;
}

TEST_F(RecipeTest, BadConfigIsRefusedBeforeAnythingLoads) {
  Outcome r = run("", "full_finetune_single_device", "full_single_device", "optimizer.lrr=1e-3 batch_size=zero", out());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("optimizer.lrr"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optimizer.lr"), std::string::npos) << r.output;  // the suggestion
  EXPECT_NE(r.output.find("batch_size"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(fs::path(out()) / "logs"));
}

TEST_F(RecipeTest, LoraAdapterAndMergedModelLoadInTransformersAndPeftWithOurLogits) {
  Outcome r = run("", "lora_finetune_single_device", "lora_single_device",
              "epochs=1 max_steps_per_epoch=6 batch_size=4 model.lora_rank=4 model.lora_alpha=8 optimizer.lr=1e-2", out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string ckpt = out() + "/epoch_0";
  ASSERT_TRUE(fs::exists(ckpt + "/adapter_model.safetensors"));
  ASSERT_TRUE(fs::exists(ckpt + "/adapter_config.json"));
  // The adapter's B moved away from zero: training touched it.
  io::SafetensorsFile adapter = io::SafetensorsFile::open(ckpt + "/adapter_model.safetensors");
  Tensor b = adapter.to_f32("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  double norm = 0;
  for (int64_t i = 0; i < b.numel(); ++i) norm += std::fabs(b.f32()[i]);
  EXPECT_GT(norm, 0.0);

  const std::vector<int32_t> ids = {0, 17, 42, 99, 5, 200, 311, 7, 64, 128};
  std::string ids_text;
  for (int32_t id : ids) ids_text += " " + std::to_string(id);
  const std::string logits_file = (dir_ / "hf_logits.safetensors").string();
  Outcome py = sh("python3 " + kSource + "/tests/train/recipes/hf_peft_logits.py " + model() + " " + ckpt + " " + logits_file + ids_text);
  if (py.exit_code == 3) GTEST_SKIP() << "torch/transformers/peft not installed: " << py.output;
  ASSERT_EQ(py.exit_code, 0) << py.output;

  auto ours = model::Decoder::from_pretrained(ckpt);  // ktune's merged model
  model::Batch batch{ids.data(), nullptr, nullptr, nullptr, 1, int64_t(ids.size())};
  Tensor logits = ours->forward_logits(batch);
  io::SafetensorsFile reference = io::SafetensorsFile::open(logits_file);
  for (const char* which : {"merged", "peft"}) {
    Tensor ref = reference.to_f32(which);
    ASSERT_EQ(ref.numel(), logits.numel()) << which;
    double max_abs = 0, max_ref = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      max_abs = std::max(max_abs, double(std::fabs(ref.f32()[i] - logits.f32()[i])));
      max_ref = std::max(max_ref, double(std::fabs(ref.f32()[i])));
    }
    EXPECT_LE(max_abs / max_ref, 1e-4) << which << ": max |diff| " << max_abs << " of max |logit| " << max_ref;
  }
}

TEST_F(RecipeTest, ResumeFromAMidEpochCheckpointContinuesExactly) {
  const std::string args = "epochs=2 max_steps_per_epoch=4 batch_size=4 save_every_n_steps=2";
  Outcome full = run("", "full_finetune_single_device", "full_single_device", args, out("a"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  // A run that "died" after step 2: only its step_2 checkpoint and logs survive.
  fs::create_directories(out("b"));
  fs::copy(out("a") + "/step_2", out("b") + "/step_2", fs::copy_options::recursive);
  Outcome resumed = run("", "full_finetune_single_device", "full_single_device", args + " resume_from_checkpoint=True", out("b"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  auto a = losses(out("a"));
  auto b = losses(out("b"));
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 6u);  // steps 3..8
  for (const auto& [step, loss] : b) EXPECT_NEAR(loss, a.at(step), 1e-6 * std::max(1.0, a.at(step))) << "step " << step;
}

TEST_F(RecipeTest, TwoProcessesEqualOneWithTheDoubledBatch) {
  Outcome one = run("", "full_finetune_distributed", "full_single_device", "epochs=1 max_steps_per_epoch=3 batch_size=4", out("one"));
  Outcome two = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device",
                "epochs=1 max_steps_per_epoch=3 batch_size=2", out("two"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("[rank1]"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("sharded data parallel (FSDP) over 2 ranks"), std::string::npos) << two.output;
  // The DDP baseline (replicated weights, all-reduced gradients) agrees too.
  setenv("KTUNE_DATA_PARALLEL", "replicate", 1);
  Outcome ddp = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device",
                    "epochs=1 max_steps_per_epoch=3 batch_size=2", out("ddp"));
  unsetenv("KTUNE_DATA_PARALLEL");
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_NE(ddp.output.find("replicated data parallel (DDP) over 2 ranks"), std::string::npos) << ddp.output;
  auto l1 = losses(out("one"));
  auto l2 = losses(out("two"));
  auto l3 = losses(out("ddp"));
  ASSERT_EQ(l1.size(), 3u);
  ASSERT_EQ(l2.size(), 3u);
  ASSERT_EQ(l3.size(), 3u);
  for (const auto& [step, loss] : l1) {
    EXPECT_NEAR(l2.at(step), loss, 1e-4 * std::max(1.0, loss)) << "step " << step;
    EXPECT_NEAR(l3.at(step), loss, 1e-4 * std::max(1.0, loss)) << "ddp step " << step;
  }
  // And the final weights agree.
  auto m1 = model::Decoder::from_pretrained(out("one") + "/epoch_0");
  auto m2 = model::Decoder::from_pretrained(out("two") + "/epoch_0");
  auto p1 = m1->parameters();
  auto p2 = m2->parameters();
  double worst = 0;
  for (size_t i = 0; i < p1.size(); ++i)
    for (int64_t j = 0; j < p1[i]->value.numel(); ++j)
      worst = std::max(worst, double(std::fabs(p1[i]->value.f32()[j] - p2[i]->value.f32()[j])));
  EXPECT_LT(worst, 1e-4);
}

// ---- distributed: sharded data parallelism (FSDP) through `ktune run` ----

namespace {

// Largest |a - b| over the tensors of two safetensors files with the same names.
double max_abs_diff(const std::string& a_path, const std::string& b_path) {
  io::SafetensorsFile a = io::SafetensorsFile::open(a_path);
  io::SafetensorsFile b = io::SafetensorsFile::open(b_path);
  EXPECT_EQ(a.names().size(), b.names().size());
  double worst = 0;
  for (const std::string& name : a.names()) {
    Tensor x = a.to_f32(name), y = b.to_f32(name);
    EXPECT_EQ(x.numel(), y.numel()) << name;
    for (int64_t i = 0; i < std::min(x.numel(), y.numel()); ++i)
      worst = std::max(worst, double(std::fabs(x.f32()[i] - y.f32()[i])));
  }
  return worst;
}

}  // namespace

// The ranks of a sharded CPU run map the checkpoint and copy only their shards out of it (then unmap
// it), where each made a copy of the whole model first: W copies on a node at once. A bf16 file
// under f32 storage is read widened, a chunk of each rank's part at a time, so two ranks training
// from it (a full fine-tune; DoRA, its frozen base sharded too) log the same losses digit for digit
// and write the same checkpoints byte for byte as from the f32 file of the same values; and under
// bf16 storage the f32 file is read rounded, as the bf16 file holds it.
TEST_F(RecipeTest, ShardedRanksCopyOnlyTheirShardsOutOfTheMappedCheckpointInItsDtype) {
  const std::string bf16_model = recipe_testing::copy_of_model(model(), out("bf16_model"), DType::BF16);
  const std::string f32_model = recipe_testing::copy_of_model(bf16_model, out("f32_of_bf16_model"), DType::F32);
  const struct {
    const char *what, *recipe, *config, *args;
    bool f32_storage;
  } cases[] = {{"full fp32", "full_finetune_distributed", "full_single_device", "dtype=fp32", true},
               {"dora fp32", "lora_finetune_distributed", "lora_single_device", "dtype=fp32 model.use_dora=True", true},
               {"full bf16", "full_finetune_distributed", "full_single_device", "dtype=bf16", false}};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    fs::remove_all(out("from_bf16"));
    fs::remove_all(out("from_f32"));
    const std::string args = std::string("epochs=1 max_steps_per_epoch=2 batch_size=2 ") + c.args;
    Outcome from_bf16 = run("--nproc_per_node 2 --standalone", c.recipe, c.config,
                            args + " checkpointer.checkpoint_dir=" + bf16_model, out("from_bf16"));
    Outcome from_f32 = run("--nproc_per_node 2 --standalone", c.recipe, c.config,
                           args + " checkpointer.checkpoint_dir=" + f32_model, out("from_f32"));
    ASSERT_EQ(from_bf16.exit_code, 0) << from_bf16.output;
    ASSERT_EQ(from_f32.exit_code, 0) << from_f32.output;
    for (const std::string rank : {"[rank0]", "[rank1]"}) {
      EXPECT_NE(from_bf16.output.find(rank + " INFO: " + bf16_model + ": values mapped from the checkpoint files"),
                std::string::npos)
          << from_bf16.output;
      EXPECT_NE(from_f32.output.find(rank + " INFO: " + f32_model + ": values mapped from the checkpoint files"),
                std::string::npos)
          << from_f32.output;
    }
    const Outcome& other_dtype = c.f32_storage ? from_bf16 : from_f32;  // held in its file's dtype, read as stored
    EXPECT_NE(other_dtype.output.find(std::string("(some held in the files' dtype, read as ") +
                                      (c.f32_storage ? "f32" : "bf16") + ")"),
              std::string::npos)
        << other_dtype.output;
    EXPECT_NE(from_f32.output.find("sharded data parallel (FSDP) over 2 ranks"), std::string::npos) << from_f32.output;
    ASSERT_EQ(losses(out("from_bf16")).size(), 2u);
    EXPECT_EQ(recipe_testing::logged(out("from_bf16")), recipe_testing::logged(out("from_f32")));
    const std::map<std::string, std::string> files = recipe_testing::safetensors_bytes(out("from_bf16") + "/epoch_0");
    EXPECT_FALSE(files.empty());
    EXPECT_TRUE(files == recipe_testing::safetensors_bytes(out("from_f32") + "/epoch_0"))
        << "the checkpoints from the bf16 and the f32 file differ";
  }
}

TEST_F(RecipeTest, TwoShardedLoraProcessesEqualOneWithTheDoubledBatch) {
  // Resharding kept off after the forward here (the full test above reshards): both are exact.
  const std::string args = "epochs=1 max_steps_per_epoch=3 model.lora_rank=4 model.lora_alpha=8 optimizer.lr=1e-2 "
                           "fsdp_reshard_after_forward=False";
  Outcome one = run("", "lora_finetune_distributed", "lora_single_device", args + " batch_size=4", out("one"));
  Outcome two = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device",
                    args + " batch_size=2", out("two"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(two.output.find("reshard_after_forward=false"), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("frozen base sharded"), std::string::npos) << two.output;
  auto l1 = losses(out("one"));
  auto l2 = losses(out("two"));
  ASSERT_EQ(l1.size(), 3u);
  ASSERT_EQ(l2.size(), 3u);
  for (const auto& [step, loss] : l1) EXPECT_NEAR(l2.at(step), loss, 1e-4 * std::max(1.0, loss)) << "step " << step;
  // The adapters (PEFT file) and the merged model agree; and training moved the adapters.
  EXPECT_LT(max_abs_diff(out("one") + "/epoch_0/adapter_model.safetensors", out("two") + "/epoch_0/adapter_model.safetensors"), 1e-5);
  EXPECT_LT(max_abs_diff(out("one") + "/epoch_0/model-00001-of-00001.safetensors",
                         out("two") + "/epoch_0/model-00001-of-00001.safetensors"), 1e-5);
  EXPECT_GT(max_abs_diff(out("two") + "/epoch_0/model-00001-of-00001.safetensors", model() + "/model.safetensors"), 1e-4);
}

// DoRA over several ranks: each rank makes the starting magnitudes of every third adapter (the row
// norms of its base; QLoRA's quantised and dequantised) and the ranks sum them, instead of every rank
// reading every adapted base. Three ranks start from the magnitudes one process makes, bit for bit:
// with lr=0 the saved lora_magnitude_vector tensors are the starting ones, on DoRA and QLoRA + DoRA.
TEST_F(RecipeTest, DoraMagnitudesMadeAShareARankAreOneProcesssBitForBit) {
  for (const std::string extra : {"", " model.quantize_base=True"}) {
    SCOPED_TRACE(extra);
    const std::string args = "epochs=1 max_steps_per_epoch=1 batch_size=2 model.use_dora=True optimizer.lr=0" + extra;
    fs::remove_all(out("one"));
    fs::remove_all(out("three"));
    Outcome one = run("", "lora_finetune_single_device", "lora_single_device", args, out("one"));
    Outcome three = run("--nproc_per_node 3 --standalone", "lora_finetune_distributed", "lora_single_device", args,
                        out("three"));
    ASSERT_EQ(one.exit_code, 0) << one.output;
    ASSERT_EQ(three.exit_code, 0) << three.output;
    io::SafetensorsFile a = io::SafetensorsFile::open(out("one") + "/epoch_0/adapter_model.safetensors");
    io::SafetensorsFile b = io::SafetensorsFile::open(out("three") + "/epoch_0/adapter_model.safetensors");
    int magnitudes = 0;
    for (const std::string& name : a.names()) {
      if (name.find("lora_magnitude_vector") == std::string::npos) continue;
      ++magnitudes;
      const Tensor x = a.to_f32(name), y = b.to_f32(name);
      ASSERT_EQ(x.numel(), y.numel()) << name;
      EXPECT_EQ(std::memcmp(x.raw(), y.raw(), x.bytes()), 0) << name << " differs";
      float largest = 0.0f;
      for (int64_t i = 0; i < x.numel(); ++i) largest = std::max(largest, x.f32()[i]);
      EXPECT_GT(largest, 0.0f) << name << " is all zeros";
    }
    EXPECT_GT(magnitudes, 3) << "fewer adapters than ranks: no share to sum";
  }
}

// QLoRA on a Llama holds every layer projection's base in NF4, the unadapted ones too (k, o and the
// MLP here: torchtune's FrozenNF4Linear), and its merged model holds each as torchtune's state-dict
// hook writes it, the dequantised NF4: with lr=0 (B stays 0) every layer projection of the saved model
// is the plain reference quantiser's dequantisation of the original (f32 arithmetic under fp32),
// bit for bit, and every other tensor the original. Two ranks (the base sharded) save the same bytes.
TEST_F(RecipeTest, QloraQuantisesTheUnadaptedProjectionsTooAndSavesThemDequantisedAsTorchtune) {
  const std::string args = "epochs=1 max_steps_per_epoch=1 batch_size=2 optimizer.lr=0 model.quantize_base=True "
                           "model.lora_rank=4 model.lora_attn_modules=[q_proj,v_proj] model.apply_lora_to_mlp=False";
  Outcome one = run("", "lora_finetune_single_device", "lora_single_device", args, out("one"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("adapters on 8 projections; the frozen bases of the layers' 20 other projections NF4 too"),
            std::string::npos)
      << one.output;
  io::SafetensorsFile original = io::SafetensorsFile::open(model() + "/model.safetensors");
  io::SafetensorsFile merged = io::SafetensorsFile::open(out("one") + "/epoch_0/model-00001-of-00001.safetensors");
  int quantised = 0;
  for (const std::string& name : original.names()) {
    const Tensor x = original.to_f32(name), y = merged.to_f32(name);
    ASSERT_EQ(x.numel(), y.numel()) << name;
    Tensor want = x;
    if (name.rfind("model.layers.", 0) == 0 && name.find("_proj.weight") != std::string::npos) {
      ++quantised;
      const int64_t n = x.numel();
      std::vector<uint8_t> codes(static_cast<size_t>(n / 2));
      std::vector<float> scales(static_cast<size_t>(n / cpu::kNf4BlockSize));
      cpu::nf4_quantize_reference(codes.data(), scales.data(), x.f32(), n, cpu::Nf4Arithmetic::kF32);
      want = Tensor::empty(x.shape());
      cpu::nf4_dequantize(want.f32(), codes.data(), scales.data(), n, cpu::Nf4Arithmetic::kF32);
    }
    EXPECT_EQ(std::memcmp(want.raw(), y.raw(), want.bytes()), 0) << name << " is not its expected merged value";
  }
  EXPECT_EQ(quantised, 4 * 7);
  Outcome two = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device", args, out("two"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(max_abs_diff(out("one") + "/epoch_0/model-00001-of-00001.safetensors",
                         out("two") + "/epoch_0/model-00001-of-00001.safetensors"),
            0.0);
}

TEST_F(RecipeTest, ShardedResumeFromAMidEpochCheckpointContinuesExactly) {
  const std::string launcher = "--nproc_per_node 2 --standalone";
  const std::string args = "epochs=2 max_steps_per_epoch=3 batch_size=2 save_every_n_steps=2";
  Outcome full = run(launcher, "full_finetune_distributed", "full_single_device", args, out("a"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  // What a run killed as its re-save of step_2 moved into place leaves: step_2 moved aside, and a
  // later save that never finished. Rank 0 puts step_2 back before either rank looks for it.
  fs::create_directories(out("b"));
  fs::copy(out("a") + "/step_2", out("b") + "/.step_2.old-99994242", fs::copy_options::recursive);
  fs::create_directories(out("b") + "/.epoch_0.tmp-99994343/recipe_state");
  Outcome resumed = run(launcher, "full_finetune_distributed", "full_single_device", args + " resume_from_checkpoint=True", out("b"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("interrupted save: " + out("b") + "/step_2: restored from .step_2.old-99994242"),
            std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("interrupted save: " + out("b") + "/.epoch_0.tmp-99994343: removed"), std::string::npos)
      << resumed.output;
  auto a = losses(out("a"));
  auto b = losses(out("b"));
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 4u);  // steps 3..6
  for (const auto& [step, loss] : b) EXPECT_NEAR(loss, a.at(step), 1e-6 * std::max(1.0, a.at(step))) << "step " << step;
  // The moments were restored too: the final weights are those of the uninterrupted run.
  EXPECT_LT(max_abs_diff(out("a") + "/epoch_1/model-00001-of-00001.safetensors",
                         out("b") + "/epoch_1/model-00001-of-00001.safetensors"), 1e-6);
  // And they are the same per-parameter moments a single process writes (no shard layout on disk).
  io::SafetensorsFile optimizer = io::SafetensorsFile::open(out("a") + "/step_2/recipe_state/optimizer.safetensors");
  bool found = false;
  for (const std::string& name : optimizer.names()) found = found || name == "exp_avg.model.layers.0.mlp.down_proj.weight";
  EXPECT_TRUE(found);
}

// Rank 0's save fails (a file-size limit standing in for a full disk: EFBIG, SIGXFSZ ignored) on a
// sharded run of two ranks, where the other rank waits for the save's gathers: copying tokenizer.json
// (15 KB, over an 8 KiB limit), and sizing the full fine-tune's optimizer.safetensors before its
// moments are gathered, or the LoRA run's merged model file before its frozen base is (over 1 MiB).
// The job ends, no rank left waiting, and its summary names rank 0's error first (recorded while its
// group was still up, before rank 1 lost it in the barrier) with the file it could not write; the
// steps before it ran, and the failed save left nothing in output_dir. (A failure inside a stream:
// ShardedDataParallelTest's failing `held`, CheckpointerSave's streams.)
TEST_F(RecipeTest, ARankZeroSaveThatFailsEndsTheShardedJobNamingTheFileAndLeavesNothing) {
  for (const std::string kind : {"full", "lora"}) {
    for (const std::string limit : {"8192", "1048576"}) {
      SCOPED_TRACE(kind + " finetune, file size limit " + limit);
      const std::string output = out(kind + "_" + limit);
      const std::string command =
          "timeout 300 prlimit --fsize=" + limit + " " + kKtune + " run --nproc_per_node 2 --standalone " + kind +
          "_finetune_distributed --config tiny/" + kind + "_single_device output_dir=" + output +
          " checkpointer.checkpoint_dir=" + model() + " tokenizer.path=" + model() +
          "/tokenizer.json dataset=torchtune.datasets.alpaca_dataset dataset.source=json dataset.data_files=" + kSource +
          "/data/quickstart/jsonl/train.jsonl seed=7 dtype=fp32 epochs=1 max_steps_per_epoch=2 batch_size=2";
      Outcome r = sh(command);
      ASSERT_NE(r.exit_code, 124) << "the job hung after rank 0's save failed: " << r.output;
      EXPECT_NE(r.exit_code, 0) << r.output;
      const size_t summary = r.output.find("job failed: rank 0 (");
      ASSERT_NE(summary, std::string::npos) << r.output;
      EXPECT_NE(r.output.find("File too large", summary), std::string::npos) << r.output;
      const std::string file = limit == "8192" ? "tokenizer.json"
                               : kind == "full" ? "recipe_state/optimizer.safetensors"
                                                : "model-00001-of-00001.safetensors";
      EXPECT_NE(r.output.find("/.epoch_0.tmp-", summary), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(file + ": ", summary), std::string::npos) << r.output;
      EXPECT_EQ(losses(output).size(), 2u) << r.output;
      std::vector<std::string> left;
      for (const auto& e : fs::directory_iterator(output)) left.push_back(e.path().filename().string());
      std::sort(left.begin(), left.end());
      EXPECT_EQ(left, (std::vector<std::string>{"logs", "torchtune_config.yaml"}));
    }
  }
}

// The same on a full disk: output_dir on a 1 MiB tmpfs of a mount namespace of its own (skipped,
// visibly, where the machine allows none). Rank 0 finds before the first step that one checkpoint
// (the full fine-tune's 16 MB, the LoRA run's 4 MB) cannot fit, and the job ends naming output_dir
// and the sizes, with no step run. With KTUNE_SKIP_SPACE_CHECK=1 it trains, and its save fails as
// the file that does not fit opens (the checkpoint's files reserve their blocks: the full
// fine-tune's moments, 6 MB; the LoRA run's merged model, 3 MB), naming the file, the bytes it
// needed and those free, before any of its values is written; the job ends naming rank 0, and the
// tmpfs holds only the logs afterwards.
TEST_F(RecipeTest, NoRoomForACheckpointStopsTheRunBeforeItTrainsOrElseFailsTheSaveAsItsFileOpens) {
  const std::string probe_dir = out("probe");
  fs::create_directories(probe_dir);
  Outcome probe = sh("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs " + probe_dir + " && echo mounted'");
  if (probe.output.find("mounted") == std::string::npos)
    GTEST_SKIP() << "this machine cannot mount a small tmpfs in a mount namespace (unshare -m): " << probe.output;
  for (const std::string kind : {"full", "lora"}) {
    for (const bool skip_check : {false, true}) {
      SCOPED_TRACE(kind + " finetune" + (skip_check ? ", KTUNE_SKIP_SPACE_CHECK=1" : ""));
      const std::string output = out(kind + (skip_check ? "_skip" : ""));
      fs::create_directories(output);
      const std::string ktune_run =
          std::string(skip_check ? "KTUNE_SKIP_SPACE_CHECK=1 " : "") + "timeout 300 " + kKtune +
          " run --nproc_per_node 2 --standalone " + kind + "_finetune_distributed --config tiny/" + kind +
          "_single_device output_dir=" + output + " checkpointer.checkpoint_dir=" + model() + " tokenizer.path=" +
          model() + "/tokenizer.json dataset=torchtune.datasets.alpaca_dataset dataset.source=json dataset.data_files=" +
          kSource + "/data/quickstart/jsonl/train.jsonl seed=7 dtype=fp32 epochs=1 max_steps_per_epoch=2 batch_size=2";
      Outcome r = sh("unshare -m sh -c 'mount -t tmpfs -o size=1m tmpfs " + output + " && { " + ktune_run +
                     "; rc=$?; echo LEFT: $(ls -A " + output + "); cat " + output + "/logs/log_*.txt; exit $rc; }'");
      ASSERT_NE(r.exit_code, 124) << "the job hung: " << r.output;
      EXPECT_NE(r.exit_code, 0) << r.output;
      const size_t summary = r.output.find("job failed: rank 0 (");
      ASSERT_NE(summary, std::string::npos) << r.output;
      const std::string fewer = "fewer than one checkpoint needs: ";
      if (!skip_check) {
        EXPECT_NE(r.output.find("output_dir " + output + ": has ", summary), std::string::npos) << r.output;
        EXPECT_NE(r.output.find(fewer, summary), std::string::npos) << r.output;
        EXPECT_NE(r.output.find("(env KTUNE_SKIP_SPACE_CHECK=1 trains anyway)", summary), std::string::npos) << r.output;
        EXPECT_EQ(r.output.find("Step 1 | loss:"), std::string::npos) << "a step ran: " << r.output;
        continue;
      }
      EXPECT_NE(r.output.find(fewer), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("(training anyway: KTUNE_SKIP_SPACE_CHECK=1)"), std::string::npos) << r.output;
      const std::string file = kind == "full" ? "recipe_state/optimizer.safetensors" : "model-00001-of-00001.safetensors";
      EXPECT_NE(r.output.find("/.epoch_0.tmp-", summary), std::string::npos) << r.output;
      EXPECT_NE(r.output.find(file + ": cannot reserve the file's ", summary), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("No space left on device (", summary), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("\nLEFT: logs torchtune_config.yaml\n"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("Step 2 | loss:"), std::string::npos) << r.output;
    }
  }
}

// A checkpoint inside an epoch holds each rank's share of its batches: another world size is refused
// there, naming both; one at an epoch's end holds whole tensors only, and another world size takes it up.
TEST_F(RecipeTest, ResumingWithAnotherWorldSizeIsRefusedMidEpochAndTakenAtAnEpochsEnd) {
  const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2 save_every_n_steps=1";
  Outcome two = run("--nproc_per_node 2 --standalone", "full_finetune_distributed", "full_single_device", args, out());
  ASSERT_EQ(two.exit_code, 0) << two.output;
  const std::string mid = out() + "-mid";
  fs::copy(out(), mid, fs::copy_options::recursive);
  fs::remove_all(mid + "/epoch_0");  // the step_1 checkpoint is the latest with a recipe state
  Outcome one = run("", "full_finetune_distributed", "full_single_device", args + " resume_from_checkpoint=True", mid);
  EXPECT_NE(one.exit_code, 0) << one.output;
  EXPECT_NE(one.output.find("step_1"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("was written by 2 ranks in the middle of an epoch; this run has 1"), std::string::npos)
      << one.output;
  const std::string more = "epochs=2 max_steps_per_epoch=2 batch_size=2 save_every_n_steps=1 resume_from_checkpoint=True";
  Outcome at_end = run("", "full_finetune_distributed", "full_single_device", more, out());
  EXPECT_EQ(at_end.exit_code, 0) << at_end.output;
  EXPECT_NE(at_end.output.find("written by 2 ranks at an epoch's end; 1 take it up"), std::string::npos) << at_end.output;
  EXPECT_NE(at_end.output.find("resumed from " + out() + "/epoch_0 at step 2"), std::string::npos) << at_end.output;
  EXPECT_TRUE(fs::exists(out() + "/epoch_1")) << at_end.output;
  EXPECT_NE(at_end.output.find("was written by a run of epochs=1; this run trains to epochs=2"), std::string::npos)
      << at_end.output;  // the run's length changed: said, as torchtune warns
  fs::remove_all(mid);
}

// A size-specific builder (lora_llama3_2_1b) builds Llama 3.2 1B whatever the checkpoint holds: a
// checkpoint of another shape (the tiny model) is refused before anything loads, naming both shapes
// and the builders that take any config.json (torchtune fails here loading the state dict).
TEST_F(RecipeTest, ASizeSpecificBuilderRefusesACheckpointOfAnotherShape) {
  Outcome r = run("", "lora_finetune_single_device", "lora_single_device",
                  "epochs=1 max_steps_per_epoch=1 model=torchtune.models.llama3_2.lora_llama3_2_1b "
                  "checkpointer.model_type=LLAMA3_2",
                  out());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error: model._component_ torchtune.models.llama3_2.lora_llama3_2_1b: builds llama3_2/1B "
                          "(llama, hidden_size 2048, intermediate_size 8192, 16 layers, 32 heads (8 key/value), "
                          "vocab_size 128256), but " + model() + "/config.json describes another model"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ktune.models.hf_model / lora_hf_model / qlora_hf_model"), std::string::npos) << r.output;
}

// A dataset whose every label is masked (here each prompt cut to 8 tokens before its response) stops
// the run before its first step, saying why, instead of training on nothing with a loss of 0.
TEST_F(RecipeTest, ADatasetWithNothingToTrainOnIsRefusedBeforeTheFirstStep) {
  Outcome r = run("", "full_finetune_single_device", "full_single_device",
                  "epochs=1 max_steps_per_epoch=2 tokenizer.max_seq_len=8", out());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error: dataset: no sample has a token to train on: every label is masked ("), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("samples were cut to tokenizer.max_seq_len=8 before their responses: raise it)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("Step 1 |"), std::string::npos) << r.output;
}

// Rows longer than the model's positions (packs of 1024 tokens; the tiny model's config.json says
// max_position_embeddings 512) are refused before the first step, naming both lengths, the file and
// the ways out (torchtune's decoder refuses such a row at the step that meets it); packs of 512 train.
TEST_F(RecipeTest, RowsLongerThanTheModelsPositionsAreRefusedBeforeTheFirstStep) {
  Outcome r = run("", "full_finetune_single_device", "full_single_device",
                  "epochs=1 max_steps_per_epoch=1 batch_size=1 dataset.packed=True tokenizer.max_seq_len=1024", out());
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("error: dataset: rows of up to 1024 tokens are longer than the model's 512 positions "
                          "(max_position_embeddings in " + model() + "/config.json): set tokenizer.max_seq_len=512 or less"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("Step 1 |"), std::string::npos) << r.output;
  Outcome fits = run("", "full_finetune_single_device", "full_single_device",
                     "epochs=1 max_steps_per_epoch=1 batch_size=1 dataset.packed=True tokenizer.max_seq_len=512", out());
  EXPECT_EQ(fits.exit_code, 0) << fits.output;
  EXPECT_NE(fits.output.find("training done: 1 steps"), std::string::npos) << fits.output;
}

// A text corpus with blank lines: their samples (no token: Llama 3's encoding of empty text) are left
// out with a warning naming the first, and the run trains on the rest; torchtune's step fails on a
// batch of them. The tokenizer's special tokens come from the tokenizer_config.json beside its
// tokenizer.json (eos <|eot_id|>, as HF's AutoTokenizer reads them), and the run says so.
TEST_F(RecipeTest, BlankLinesOfATextCorpusAreLeftOutSayingWhere) {
  const std::string corpus = (dir_ / "corpus.txt").string();
  std::ofstream(corpus) << "sort 3 1 2\n\nreverse 1 2 3 4\n\n\nsort 9 8 7\n";
  Outcome r = run("", "full_finetune_single_device", "full_single_device",
                  "epochs=1 batch_size=1 dataset._component_=torchtune.datasets.text_completion_dataset dataset.source=text "
                  "dataset.data_files=" + corpus + " ~dataset.train_on_input",
                  out());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("3 samples of no token (empty text) left out; the first: " + corpus + ": row 1 (line 2)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dataset: 3 samples"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokenizer: special tokens and chat template from " + model() + "/tokenizer_config.json"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("training done: 3 steps"), std::string::npos) << r.output;
  // A model_type of another family (the tiny model is a llama) is said, and the run trains.
  Outcome gemma = run("", "full_finetune_single_device", "full_single_device",
                      "epochs=1 max_steps_per_epoch=1 checkpointer.model_type=GEMMA2", out("gemma"));
  EXPECT_EQ(gemma.exit_code, 0) << gemma.output;
  EXPECT_NE(gemma.output.find("WARN: checkpointer.model_type=GEMMA2 is for gemma2 models, but " + model() +
                              "/config.json describes llama: the run trains what config.json describes"),
            std::string::npos) << gemma.output;
}

// A resume whose trained weights would not fit the checkpoint's is refused before any is loaded,
// naming the checkpoint, the tensor and both shapes (another LoRA rank), or the tensor the run would
// train that the checkpoint lacks (another module adapted); a mid-epoch resume with another
// gradient_accumulation_steps is refused naming both values (the epoch's remaining batches would be
// counted in other steps), while the same value resumes.
TEST_F(RecipeTest, ResumingWithOtherAdaptersOrAccumulationIsRefusedNamingWhat) {
  const std::string args = "epochs=1 max_steps_per_epoch=4 batch_size=2 save_every_n_steps=1";
  const std::string trained = " model.lora_rank=4 gradient_accumulation_steps=2";
  Outcome first = run("", "lora_finetune_single_device", "lora_single_device", args + trained, out());
  ASSERT_EQ(first.exit_code, 0) << first.output;
  fs::remove_all(out() + "/epoch_0");
  for (int step : {2, 3, 4}) fs::remove_all(out() + "/step_" + std::to_string(step));  // step_1 the latest
  Outcome rank = run("", "lora_finetune_single_device", "lora_single_device",
                     args + " model.lora_rank=8 gradient_accumulation_steps=2 resume_from_checkpoint=True", out());
  EXPECT_NE(rank.exit_code, 0) << rank.output;
  EXPECT_NE(rank.output.find("step_1: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight: saved with "
                             "shape (4, "),
            std::string::npos)
      << rank.output;
  EXPECT_NE(rank.output.find("resume with the model settings the checkpoint was trained with"), std::string::npos)
      << rank.output;
  Outcome modules = run("", "lora_finetune_single_device", "lora_single_device",
                        args + trained + " model.apply_lora_to_mlp=False resume_from_checkpoint=True", out());
  EXPECT_NE(modules.exit_code, 0) << modules.output;
  EXPECT_NE(modules.output.find("the recipe state holds weights for base_model.model.model.layers.0.mlp."),
            std::string::npos)
      << modules.output;
  Outcome accumulation = run("", "lora_finetune_single_device", "lora_single_device",
                             args + " model.lora_rank=4 gradient_accumulation_steps=1 resume_from_checkpoint=True", out());
  EXPECT_NE(accumulation.exit_code, 0) << accumulation.output;
  EXPECT_NE(accumulation.output.find("stopped at step 1 of an epoch with gradient_accumulation_steps=2; this run has 1"),
            std::string::npos)
      << accumulation.output;
  Outcome same =
      run("", "lora_finetune_single_device", "lora_single_device", args + trained + " resume_from_checkpoint=True", out());
  EXPECT_EQ(same.exit_code, 0) << same.output;
}

// Every rank loads the checkpoint itself and the ranks compare fingerprints of their weights instead
// of receiving rank 0's: a rank that loaded other weights (here rank 1, through its own
// checkpoint_dir: model${RANK}) stops the job before any step, the ranks naming it and the first
// parameter that differs, on both recipes. seed=null: the ranks take rank 0's seed, so the LoRA
// adapters they draw agree and the run trains.
TEST_F(RecipeTest, RanksThatLoadedDifferentWeightsStopNamingTheRankAndParameter) {
  fs::create_directory_symlink(model(), dir_ / "model0");
  Outcome init = sh(kKtune + " init-model --config " + kSource + "/examples/quickstart/config.json --output-dir " +
                    (dir_ / "model1").string() + " --seed 4");
  ASSERT_EQ(init.exit_code, 0) << init.output;
  // The launcher checks the config without RANK (model0); each worker reads its own.
  const std::string per_rank_model = " 'checkpointer.checkpoint_dir=" + (dir_ / "model").string() + "${oc.env:RANK,0}'";
  const std::string args = "epochs=1 max_steps_per_epoch=2 batch_size=2";
  for (const std::string kind : {"full", "lora"}) {
    Outcome r = run("--nproc_per_node 2 --standalone", kind + "_finetune_distributed", kind + "_single_device",
                    args + per_rank_model, out(kind));
    EXPECT_NE(r.exit_code, 0) << r.output;
    const std::string error = "error: the starting weights: rank 1 differs from rank 0, first at model.embed_tokens.weight";
    // Both ranks find the difference at the same moment, but the launcher stops the other as soon as
    // the first exits, which may be before it has said so (seen once under load): one of them says it.
    EXPECT_TRUE(r.output.find("[rank0]: " + error) != std::string::npos ||
                r.output.find("[rank1]: " + error) != std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(out(kind) + "/logs")) << "a step ran";
  }
  Outcome seedless = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device",
                         args + " seed=null", out("seedless"));
  ASSERT_EQ(seedless.exit_code, 0) << seedless.output;
  EXPECT_EQ(losses(out("seedless")).size(), 2u);
}

TEST_F(RecipeTest, KillingOneWorkerEndsTheJobWithTheRankNamedAndNoHang) {
  // A long run in the background, its output in a file; its pid is the launcher's (exec).
  const std::string log = (dir_ / "launcher.log").string();
  const std::string cmd = "exec " + kKtune + " run --nproc_per_node 2 --standalone full_finetune_distributed --config tiny/full_single_device"
                          " output_dir=" + out() + " checkpointer.checkpoint_dir=" + model() + " tokenizer.path=" + model() +
                          "/tokenizer.json dataset=torchtune.datasets.alpaca_dataset dataset.source=json dataset.data_files=" +
                          kSource + "/data/quickstart/jsonl/train.jsonl dtype=fp32 seed=7 epochs=1000 batch_size=2";
  pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  auto read_log = [&] {
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // Rank 1: the launcher's child whose environment says RANK=1; wait until training has begun.
  pid_t victim = 0;
  while (std::chrono::steady_clock::now() < deadline && victim == 0) {
    if (fs::exists(fs::path(out()) / "logs") && !losses(out()).empty()) {
      for (const auto& e : fs::directory_iterator("/proc")) {
        std::ifstream stat(e.path() / "stat");
        std::string pid, comm, state;
        long ppid = 0;
        if (!(stat >> pid >> comm >> state >> ppid) || ppid != launcher) continue;
        std::ifstream environ_file(e.path() / "environ");
        std::string entry;
        while (std::getline(environ_file, entry, '\0'))
          if (entry == "RANK=1") victim = pid_t(std::stol(pid));
      }
    }
    if (victim == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (victim == 0) {
    kill(launcher, SIGKILL);
    waitpid(launcher, nullptr, 0);
    FAIL() << "rank 1 never started training: " << read_log();
  }
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  int status = 0;
  pid_t done = 0;
  while (std::chrono::steady_clock::now() < deadline && (done = waitpid(launcher, &status, WNOHANG)) == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (done == 0) {  // a hang: clean up, then fail
    kill(launcher, SIGTERM);
    waitpid(launcher, &status, 0);
    FAIL() << "the job did not end after rank 1 was killed: " << read_log();
  }
  const std::string output = read_log();
  ASSERT_TRUE(WIFEXITED(status)) << output;
  EXPECT_NE(WEXITSTATUS(status), 0) << output;
  EXPECT_NE(output.find("job failed: "), std::string::npos) << output;
  EXPECT_NE(output.find("rank 1 (node0, pid " + std::to_string(victim) + ") was killed by signal Killed (not by its parent"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("its peak resident memory was "), std::string::npos) << output;
  // No worker outlives the job.
  EXPECT_NE(kill(victim, 0), 0);
}

TEST_F(RecipeTest, PlanPrintsThePerRankStateAShardedRunHolds) {
  for (const char* recipe : {"full", "lora"}) {
    const bool lora = std::string(recipe) == "lora";
    Outcome plan = sh(kKtune + " plan --model " + model() + " --nproc_per_node 2 --dtype fp32 --recipe " + recipe +
                      (lora ? " --lora_rank 4 --lora_attn_modules q_proj,v_proj" : ""));
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(plan.output, m, std::regex(R"(trainable parameters +[0-9.]+ GiB \((\d+) bytes\))")))
        << plan.output;
    char expected[64];
    std::snprintf(expected, sizeof expected, "per rank %.2f MiB parameters", std::stod(m[1]) / (1 << 20));
    Outcome run2 = run("--nproc_per_node 2 --standalone", lora ? "lora_finetune_distributed" : "full_finetune_distributed",
                       lora ? "lora_single_device" : "full_single_device",
                       std::string("epochs=1 max_steps_per_epoch=1 batch_size=2") +
                           (lora ? " model.lora_rank=4 model.lora_attn_modules=[q_proj,v_proj] model.apply_lora_to_mlp=False" : ""),
                       out(recipe));
    ASSERT_EQ(run2.exit_code, 0) << run2.output;
    EXPECT_NE(run2.output.find(expected), std::string::npos) << recipe << ": " << expected << "\n" << run2.output;
    // What a checkpoint takes on disk: the tensor data the run's epoch_0 holds.
    auto planned = [&](const std::string& what) -> int64_t {
      std::smatch d;
      if (!std::regex_search(plan.output, d, std::regex("  " + what + R"( +[0-9.]+ GiB \((\d+) bytes\))"))) return -1;
      return std::stoll(d[1]);
    };
    auto tensor_bytes = [&](const std::string& file) {
      io::SafetensorsFile f = io::SafetensorsFile::open(out(recipe) + "/epoch_0/" + file);
      int64_t bytes = 0;
      for (const std::string& name : f.names()) bytes += int64_t(f.info(name).end - f.info(name).begin);
      return bytes;
    };
    EXPECT_EQ(planned("merged model"), tensor_bytes("model-00001-of-00001.safetensors")) << plan.output;
    EXPECT_EQ(planned("recipe state"), tensor_bytes("recipe_state/trainable.safetensors") +
                                           tensor_bytes("recipe_state/optimizer.safetensors"))
        << plan.output;
    EXPECT_EQ(planned("adapter"), lora ? tensor_bytes("adapter_model.safetensors") : -1) << plan.output;
  }
  Outcome bad = sh(kKtune + " plan --model " + model() + " --dtype fp16");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("--dtype"), std::string::npos) << bad.output;
}

TEST_F(RecipeTest, ValidationLossIsTheSameOnOneAndTwoShardedProcessesAndFalls) {
  // 40 held-out rows: 10 batches of 4 on one process, 10 of 2 on each of two; the same tokens.
  const std::string args = "epochs=1 max_steps_per_epoch=6 model.lora_rank=4 model.lora_alpha=8 optimizer.lr=1e-2 "
                           "dataset_val._component_=torchtune.datasets.alpaca_dataset dataset_val.source=json dataset_val.data_files=" +
                           kSource + "/data/quickstart/jsonl/validation.jsonl run_val_every_n_steps=3";
  Outcome one = run("", "lora_finetune_distributed", "lora_single_device", args + " batch_size=4", out("one"));
  Outcome two = run("--nproc_per_node 2 --standalone", "lora_finetune_distributed", "lora_single_device",
                    args + " batch_size=2", out("two"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_NE(one.output.find("dataset_val: 40 samples"), std::string::npos) << one.output;
  auto v1 = losses(out("one"), "val_loss");
  auto v2 = losses(out("two"), "val_loss");
  ASSERT_EQ(v1.size(), 2u) << one.output;  // after steps 3 and 6
  ASSERT_EQ(v2.size(), 2u) << two.output;
  for (const auto& [step, loss] : v1) EXPECT_NEAR(v2.at(step), loss, 1e-4 * loss) << "step " << step;
  EXPECT_LT(v1.at(6), v1.at(3)) << "training on the task lowers the held-out loss";
  // The training loss lines are still one a step, next to the validation lines.
  EXPECT_EQ(losses(out("one")).size(), 6u);
}

TEST_F(RecipeTest, ValidationWithoutAnIntervalRunsAtTheEndOfEachEpoch) {
  Outcome r = run("", "full_finetune_distributed", "full_single_device",
                  "epochs=2 max_steps_per_epoch=2 batch_size=8 dataset_val._component_=torchtune.datasets.alpaca_dataset "
                  "dataset_val.source=json dataset_val.data_files=" + kSource + "/data/quickstart/jsonl/validation.jsonl",
                  out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto v = losses(out(), "val_loss");
  ASSERT_EQ(v.size(), 2u) << r.output;
  EXPECT_TRUE(v.count(2) && v.count(4)) << r.output;
}

// metric_logger: torchtune's TensorBoardLogger. The run's scalars, read back by TensorBoard's own
// loader (tensorboard's EventAccumulator), are the steps' logged values, in one run_0_<time> folder.
TEST_F(RecipeTest, TheTensorBoardLoggerWritesWhatTensorBoardReads) {
  Outcome r = run("", "full_finetune_single_device", "full_single_device",
                  "epochs=1 max_steps_per_epoch=3 batch_size=8 metric_logger._component_=torchtune.training.metric_logging."
                  "TensorBoardLogger metric_logger.log_dir=" + out() + "/tb",
                  out());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  Outcome read = sh("python3 " + kSource + "/tests/train/recipes/read_tensorboard_scalars.py " + out() + "/tb");
  if (read.exit_code == 3) GTEST_SKIP() << read.output;
  ASSERT_EQ(read.exit_code, 0) << read.output;
  // The JSON-lines twin (beside the run folder) holds the same values as doubles.
  std::map<int, double> loss;
  std::ifstream jsonl;
  for (const auto& e : fs::directory_iterator(out() + "/tb"))
    if (e.path().extension() == ".jsonl") jsonl.open(e.path());
  ASSERT_TRUE(jsonl.is_open());
  const std::regex loss_field(R"("loss":([^,}]+))"), step_field(R"("step":(\d+))");
  std::smatch l, st;
  for (std::string line; std::getline(jsonl, line);)
    if (std::regex_search(line, l, loss_field) && std::regex_search(line, st, step_field)) loss[std::stoi(st[1])] = std::stod(l[1]);
  ASSERT_EQ(loss.size(), 3u) << r.output;
  std::istringstream lines(read.output);
  std::set<std::string> runs;
  int seen = 0;
  for (std::string run, tag; lines >> run >> tag;) {
    int step;
    double value;
    lines >> step >> value;
    runs.insert(run);
    if (tag != "loss") continue;
    ++seen;
    EXPECT_EQ(value, double(float(loss.at(step)))) << "step " << step;
  }
  EXPECT_EQ(seen, 3) << read.output;
  ASSERT_EQ(runs.size(), 1u) << read.output;
  EXPECT_EQ(runs.begin()->rfind("run_0_", 0), 0u) << read.output;
  EXPECT_NE(read.output.find(" lr 1 "), std::string::npos) << read.output;
  EXPECT_TRUE(fs::exists(out() + "/torchtune_config.yaml"));  // every logger's log_config saves it, as torchtune's
}

// torchtune's HuggingFaceModelTokenizer: conversations through the model's own chat template. Without
// one in tokenizer_config.json the run is refused before training, naming the file. With one, the
// alpaca rows become the tokens transformers' apply_chat_template gives them, and the assistant's
// tokens are the ones trained on: the run's dataset line says as many as
// chat_template_dataset_tokens.py counts with transformers.
// torchtune's profiler component, enabled: the active steps of the schedule (here steps 2 and 3 of
// a cycle of 3) are written as a Chrome trace and key averages under iteration_3/, each step with
// its phases and, inside them, every layer's forward and backward and the loss; the torch-only
// switches are said to be ignored.
TEST_F(RecipeTest, TheProfilerRecordsTheActiveStepsOfEachCycle) {
  const std::string output = out("profiled");
  Outcome run = run_tiny("", "lora_finetune_single_device", "lora_single_device",
                         "epochs=1 max_steps_per_epoch=4 profiler._component_=torchtune.training.setup_torch_profiler "
                         "profiler.enabled=True profiler.wait_steps=0 "
                         "profiler.warmup_steps=1 profiler.active_steps=2 profiler.num_cycles=1 profiler.with_stack=True "
                         "profiler.output_dir=" + output + "/profiling_outputs",
                         output);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("with_stack: torch profiler options ktune does not record"), std::string::npos) << run.output;
  const fs::path dir = fs::path(output) / "profiling_outputs" / "iteration_3";
  ASSERT_TRUE(fs::exists(dir / "rank0_trace.json")) << run.output;
  ASSERT_TRUE(fs::exists(dir / "rank0_key_averages.txt"));
  EXPECT_FALSE(fs::exists(fs::path(output) / "profiling_outputs" / "iteration_4"));  // one cycle only
  const nlohmann::json trace = nlohmann::json::parse(std::ifstream(dir / "rank0_trace.json"));
  std::map<std::string, int> count;  // "category/name" -> events
  for (const auto& e : trace["traceEvents"]) ++count[e["cat"].get<std::string>() + "/" + e["name"].get<std::string>()];
  const nlohmann::json model_config = nlohmann::json::parse(std::ifstream(model() + "/config.json"));
  const int layers = model_config["num_hidden_layers"];
  EXPECT_EQ(count["step/step 2"], 1);
  EXPECT_EQ(count["step/step 3"], 1);
  EXPECT_EQ(count["step/step 1"], 0);  // warmup
  EXPECT_EQ(count["phase/data"], 2);
  EXPECT_EQ(count["phase/forward and backward"], 2);
  EXPECT_EQ(count["phase/clip and optimizer step"], 2);
  for (int l = 0; l < layers; ++l) {
    EXPECT_EQ(count["forward/layer " + std::to_string(l)], 2) << l;
    EXPECT_EQ(count["backward/layer " + std::to_string(l)], 2) << l;
  }
  EXPECT_EQ(count["forward/norm, output projection and loss (with their backward)"], 2);
}

TEST_F(RecipeTest, HuggingFaceModelTokenizerTrainsThroughTheModelsChatTemplate) {
  // run_tiny's command line less its tokenizer.path (torchtune applies ~key before key=value).
  auto run_templated = [&](const std::string& output) {
    return sh(kKtune + " run full_finetune_single_device --config tiny/full_single_device output_dir=" + output +
              " checkpointer.checkpoint_dir=" + model() + " dataset=torchtune.datasets.alpaca_dataset dataset.source=json" +
              " dataset.data_files=" + kSource + "/data/quickstart/jsonl/train.jsonl seed=7 dtype=fp32" +
              " epochs=1 max_steps_per_epoch=3 batch_size=4 ~tokenizer.path" +
              " tokenizer._component_=torchtune.modules.transforms.tokenizers.HuggingFaceModelTokenizer" +
              " tokenizer.tokenizer_json_path=" + model() + "/tokenizer.json");
  };
  Outcome none = run_templated(out("none"));
  EXPECT_NE(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("error: " + model() + "/tokenizer_config.json: has no chat_template"), std::string::npos)
      << none.output;
  EXPECT_EQ(none.output.find("Step 1 |"), std::string::npos) << none.output;

  // A ChatML template with a default system prompt, in the quickstart tokenizer's plain text.
  nlohmann::json config = nlohmann::json::parse(std::ifstream(model() + "/tokenizer_config.json"));
  config["chat_template"] =
      "{%- if messages[0].role != 'system' %}{{- bos_token + '<|im_start|>system\\nYou sort and reverse.<|im_end|>\\n' }}"
      "{%- endif %}{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
      "'<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
  std::ofstream(model() + "/tokenizer_config.json") << config.dump(1);
  Outcome templated = run_templated(out("templated"));
  ASSERT_EQ(templated.exit_code, 0) << templated.output;
  EXPECT_NE(templated.output.find("conversations through the chat template of " + model() +
                                  "/tokenizer_config.json: chat_template"),
            std::string::npos)
      << templated.output;
  EXPECT_EQ(losses(out("templated")).size(), 3u);

  const std::string prompts = out("prompts.jsonl");
  Outcome dry = sh(kKtune + " generate --dry-run --template alpaca --prompts " + kSource +
                   "/data/quickstart/jsonl/train.jsonl > " + prompts);
  ASSERT_EQ(dry.exit_code, 0) << dry.output;
  Outcome reference = sh("python3 " + kSource + "/tests/train/recipes/chat_template_dataset_tokens.py " + model() + " " +
                         prompts + " " + kSource + "/data/quickstart/jsonl/train.jsonl");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const nlohmann::json counts = nlohmann::json::parse(reference.output.substr(reference.output.rfind('{')));
  const std::string line = "dataset: " + std::to_string(counts["samples"].get<int64_t>()) + " samples, " +
                           std::to_string(counts["tokens"].get<int64_t>()) + " tokens (" +
                           std::to_string(counts["trained"].get<int64_t>()) + " trained on)";
  EXPECT_NE(templated.output.find(line), std::string::npos) << line << " not in\n" << templated.output;
}
