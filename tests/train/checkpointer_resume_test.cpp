// What resume reads from a checkpoint's recipe_state/: the recipe state's tensors come back in the
// dtype they were saved in (f32, bf16; another dtype as f32) as views of the files' mappings, so
// that loading them allocates nothing the size of the state (every rank of a distributed run loads
// the same files and copies out only its own pieces), and the views stay valid when the checkpoint
// directory is deleted while they live. A damaged file is an error naming it.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "train/checkpointer.h"

using namespace ktune;
namespace fs = std::filesystem;

namespace {

// The process's anonymous resident bytes (RssAnon of /proc/self/status): what heap copies cost,
// file-backed mapped pages excluded.
int64_t anonymous_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "RssAnon:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
  }
  ADD_FAILURE() << "/proc/self/status has no RssAnon";
  return 0;
}

constexpr int64_t kLarge = int64_t(4) << 20;  // values of each large tensor (16 MiB f32)

float value_at(int64_t i, float salt) { return float(i % 1000) * 0.25f + salt; }

Tensor filled(int64_t n, float salt, DType dtype) {
  Tensor wide = Tensor::empty({n}, DType::F32);
  for (int64_t i = 0; i < n; ++i) wide.f32()[i] = value_at(i, salt);
  return dtype == DType::F32 ? wide : wide.to(dtype);
}

// IEEE half bits of a positive normal f32 that f16 holds exactly (the engine only reads f16).
uint16_t exact_f16_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint32_t exponent = ((bits >> 23) & 0xffu) - 127u + 15u;
  return uint16_t((exponent << 10) | ((bits & 0x7fffffu) >> 13));
}

// n values value_at(i, salt) (exact in f16 for n <= 64 and small salts) as an f16 tensor.
Tensor filled_f16(int64_t n, float salt) {
  Tensor t = Tensor::empty({n}, DType::F16);
  for (int64_t i = 0; i < n; ++i) t.data<uint16_t>()[i] = exact_f16_bits(value_at(i, salt));
  return t;
}

// A checkpoint directory whose recipe_state/ holds moments in f32 and bf16 (and a small f16 one)
// and f32 trainable weights: ~40 MiB in all.
struct RecipeStateDir {
  fs::path root = fs::temp_directory_path() / ("ktune-resume-" + std::to_string(::getpid()));
  fs::path dir = root / "step_4";

  RecipeStateDir() {
    fs::remove_all(root);
    fs::create_directories(dir / "recipe_state");
    io::write_safetensors((dir / "recipe_state" / "optimizer.safetensors").string(),
                          {{"exp_avg.w", filled(kLarge, 1.0f, DType::F32)},
                           {"exp_avg_sq.w", filled(kLarge, 2.0f, DType::BF16)},
                           {"exp_avg.h", filled_f16(64, 3.0f)}});
    io::write_safetensors((dir / "recipe_state" / "trainable.safetensors").string(),
                          {{"w", filled(kLarge, 4.0f, DType::F32)}});
    std::ofstream((dir / "recipe_state" / "recipe_state.json").string()) << R"({"global_step": 4, "epoch": 0})";
  }
  ~RecipeStateDir() { fs::remove_all(root); }

  train::HfCheckpointer checkpointer() const { return train::HfCheckpointer(root.string(), {}, root.string()); }
};

// Reads one value of every 4 KiB page of an f32 or bf16 tensor, converting nothing (a conversion's
// heap copy would count as anonymous memory).
double touch_every_page(const Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < t.numel(); i += 1024)
    sum += t.dtype() == DType::F32 ? t.f32()[i] : bf16_to_f32(t.bf16()[i]);
  return sum;
}

// Every value of t (any dtype) against value_at(i, salt) rounded as t's dtype holds it.
void expect_values(const Tensor& t, float salt, const std::string& what) {
  const Tensor expected = filled(t.numel(), salt, t.dtype()).to(DType::F32);
  const Tensor got = t.to(DType::F32);
  int64_t wrong = 0;
  for (int64_t i = 0; i < t.numel(); ++i) wrong += got.f32()[i] != expected.f32()[i];
  EXPECT_EQ(wrong, 0) << what;
}

}  // namespace

TEST(CheckpointerResume, TheRecipeStateComesBackInItsDtypesAsViewsThatAllocateNothingItsSize) {
  RecipeStateDir state;
  const int64_t before = anonymous_resident_bytes();
  train::ResumePoint point = state.checkpointer().load_resume_point(state.dir.string());
  // Reading every page faults in the files' pages: file-backed, shared with the page cache.
  double sum = 0;
  for (const auto& [name, t] : point.optimizer_state) sum += touch_every_page(t);
  sum += touch_every_page(point.trainable.at("w"));
  const int64_t grown = anonymous_resident_bytes() - before;
  EXPECT_LT(grown, kLarge) << "loading a ~40 MiB recipe state grew the anonymous resident memory by " << grown
                           << " bytes: the state was copied, not mapped (sum " << sum << ")";

  EXPECT_EQ(point.recipe_state.at("global_step"), 4);
  ASSERT_EQ(point.optimizer_state.size(), 3u);
  EXPECT_EQ(point.optimizer_state.at("exp_avg.w").dtype(), DType::F32);
  EXPECT_EQ(point.optimizer_state.at("exp_avg_sq.w").dtype(), DType::BF16);
  EXPECT_EQ(point.optimizer_state.at("exp_avg.h").dtype(), DType::F32);  // f16: widened
  EXPECT_EQ(point.trainable.at("w").dtype(), DType::F32);
  expect_values(point.optimizer_state.at("exp_avg.w"), 1.0f, "exp_avg.w");
  expect_values(point.optimizer_state.at("exp_avg_sq.w"), 2.0f, "exp_avg_sq.w");
  const Tensor h = point.optimizer_state.at("exp_avg.h");
  for (int64_t i = 0; i < 64; ++i) EXPECT_EQ(h.f32()[i], value_at(i, 3.0f)) << "exp_avg.h[" << i << "]";
  expect_values(point.trainable.at("w"), 4.0f, "w");
}

TEST(CheckpointerResume, TheViewsOutliveTheCheckpointDirectory) {
  RecipeStateDir state;
  train::ResumePoint point = state.checkpointer().load_resume_point(state.dir.string());
  fs::remove_all(state.root);  // a run that keeps few checkpoints may delete this one while resuming
  expect_values(point.optimizer_state.at("exp_avg_sq.w"), 2.0f, "exp_avg_sq.w after the directory was deleted");
  expect_values(point.trainable.at("w"), 4.0f, "w after the directory was deleted");
}

TEST(CheckpointerResume, ADamagedOptimizerFileIsAnErrorNamingIt) {
  RecipeStateDir state;
  const fs::path file = state.dir / "recipe_state" / "optimizer.safetensors";
  fs::resize_file(file, fs::file_size(file) / 2);  // cut off mid-way, as a crash during a copy would
  try {
    state.checkpointer().load_resume_point(state.dir.string());
    ADD_FAILURE() << "a truncated optimizer.safetensors was loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file.string()), std::string::npos) << e.what();
  }
}
