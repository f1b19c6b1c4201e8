// The decoder against Hugging Face transformers: logits, loss and every parameter gradient of small
// random models of each family (fixtures made by fixtures/make_hf_parity_fixtures.py), with and
// without activation checkpointing, with a frozen subset, and packing (doc_ids) against separate rows.
// Tolerances (f32): relative error <= 1e-4 on logits and loss, <= 1e-3 on gradients, where the
// relative error of a tensor is max|ktune - hf| / max|hf|.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "scoped_bf16_gemm.h"

using namespace ktune;
using namespace ktune::model;
using ktune::testing::ScopedBf16Gemm;

namespace {

// The fixture models are tiny (hidden 64): on a shared 2-core machine OpenMP's barriers cost more
// than the work, so these tests run on one thread unless KTUNE_NUM_THREADS asks otherwise. The
// kernels' own tests cover their threaded paths.
class OneThreadUnlessAsked : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!std::getenv("KTUNE_NUM_THREADS")) set_num_threads(1);
  }
};
const auto* const kOneThread = ::testing::AddGlobalTestEnvironment(new OneThreadUnlessAsked);

std::string fixture_dir(const std::string& family) {
  return std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/" + family;
}

double rel_error(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<int32_t> to_i32(const Tensor& t) {
  std::vector<int32_t> out(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[size_t(i)] = int32_t(t.data<int64_t>()[i]);
  return out;
}

struct Fixture {
  std::unique_ptr<Decoder> model;
  io::SafetensorsFile ref;
  std::vector<int32_t> tokens, labels, positions;
  int64_t B = 0, T = 0;
  Batch batch() const {
    Batch b;
    b.tokens = tokens.data();
    b.labels = labels.data();
    b.positions = positions.data();
    b.B = B;
    b.T = T;
    return b;
  }
};

Fixture load(const std::string& family) {
  Fixture f{Decoder::from_pretrained(fixture_dir(family)),
            io::SafetensorsFile::open(fixture_dir(family) + "/reference.safetensors")};
  Tensor tokens = f.ref.view("tokens");
  f.B = tokens.dim(0);
  f.T = tokens.dim(1);
  f.tokens = to_i32(tokens);
  f.labels = to_i32(f.ref.view("labels"));
  f.positions = to_i32(f.ref.view("positions"));
  return f;
}

class DecoderParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DecoderParity, LogitsMatchTransformers) {
  Fixture f = load(GetParam());
  Tensor logits = f.model->forward_logits(f.batch());
  Tensor ref = f.ref.view("logits");
  ASSERT_EQ(logits.numel(), ref.numel());
  EXPECT_LE(rel_error(logits.f32(), ref.f32(), ref.numel()), 1e-4);
}

void check_loss_and_grads(Fixture& f, const std::string& what, const std::vector<std::string>& frozen = {}) {
  const double ref_loss = f.ref.view("loss_sum").f32()[0];
  const int64_t ref_n = f.ref.view("n_valid").data<int64_t>()[0];
  LossResult r = f.model->forward_backward(f.batch(), 1.0f / float(ref_n));
  EXPECT_EQ(r.n_valid, ref_n) << what;
  EXPECT_LE(std::fabs(r.loss_sum - ref_loss) / std::fabs(ref_loss), 1e-4) << what;
  int checked = 0;
  for (Parameter* p : f.model->parameters()) {
    const bool is_frozen = std::find(frozen.begin(), frozen.end(), p->name) != frozen.end();
    if (is_frozen) {
      EXPECT_FALSE(p->trainable) << p->name;
      EXPECT_FALSE(p->grad.defined()) << what << ": frozen " << p->name << " has a gradient";
      continue;
    }
    ASSERT_TRUE(p->grad.defined()) << p->name;
    Tensor g = f.ref.view("grad." + p->name);
    ASSERT_EQ(g.shape(), p->grad.shape()) << p->name;
    EXPECT_LE(rel_error(p->grad.f32(), g.f32(), g.numel()), 1e-3) << what << ": gradient of " << p->name;
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST_P(DecoderParity, LossAndEveryGradientMatchTransformers) {
  Fixture f = load(GetParam());
  check_loss_and_grads(f, "plain");
  // forward_loss agrees with the training forward.
  LossResult e = f.model->forward_loss(f.batch());
  EXPECT_LE(std::fabs(e.loss_sum - f.ref.view("loss_sum").f32()[0]) / e.loss_sum, 1e-4);
}

TEST_P(DecoderParity, ActivationCheckpointingGivesTheSameGradients) {
  Fixture f = load(GetParam());
  f.model->set_activation_checkpointing(true);
  EXPECT_LT(f.model->planned_activation_bytes(f.B, f.T),
            [&] {
              f.model->set_activation_checkpointing(false);
              size_t full = f.model->planned_activation_bytes(f.B, f.T);
              f.model->set_activation_checkpointing(true);
              return full;
            }());
  check_loss_and_grads(f, "checkpointed");
}

TEST_P(DecoderParity, FrozenSubsetLeavesTheOtherGradientsUnchanged) {
  Fixture f = load(GetParam());
  // Freeze the embedding (so the tied head too), every q_proj and k_proj, all of layer 0's MLP and
  // the final norm: gradients must still flow through them to what stays trainable.
  std::vector<std::string> frozen;
  for (Parameter* p : f.model->parameters()) {
    const std::string& n = p->name;
    if (n == "model.embed_tokens.weight" || n.find("q_proj") != std::string::npos ||
        n.find("k_proj") != std::string::npos || n.rfind("model.layers.0.mlp.", 0) == 0 || n == "model.norm.weight")
      frozen.push_back(n);
  }
  f.model->set_trainable([&](const std::string& n) { return std::find(frozen.begin(), frozen.end(), n) == frozen.end(); });
  check_loss_and_grads(f, "frozen subset", frozen);
  // Only the top layer's attention output trainable: the backward stops early yet is exact there.
  Fixture g = load(GetParam());
  const std::string top = "model.layers." + std::to_string(g.model->config().num_layers - 1) + ".self_attn.o_proj.weight";
  std::vector<std::string> all_but_top;
  for (Parameter* p : g.model->parameters())
    if (p->name != top) all_but_top.push_back(p->name);
  g.model->set_trainable([&](const std::string& n) { return n == top; });
  check_loss_and_grads(g, "only " + top, all_but_top);
}

TEST_P(DecoderParity, GradientsAccumulateAcrossCalls) {
  Fixture f = load(GetParam());
  const int64_t n = f.ref.view("n_valid").data<int64_t>()[0];
  f.model->forward_backward(f.batch(), 0.5f / float(n));
  f.model->forward_backward(f.batch(), 0.5f / float(n));
  Parameter& p = f.model->parameter("model.layers.1.mlp.down_proj.weight");
  Tensor g = f.ref.view("grad.model.layers.1.mlp.down_proj.weight");
  EXPECT_LE(rel_error(p.grad.f32(), g.f32(), g.numel()), 1e-3);
  f.model->zero_grad();
  for (int64_t i = 0; i < p.grad.numel(); ++i) ASSERT_EQ(p.grad.f32()[i], 0.0f);
}

// A row packing two documents (positions restarting, doc_ids separating them) gives each token the
// logits it gets when its document is alone.
TEST_P(DecoderParity, PackedDocumentsMatchSeparateRows) {
  Fixture f = load(GetParam());
  const int64_t T = f.T, A = 6, V = f.model->config().vocab_size;
  std::vector<int32_t> tokens(f.tokens.begin(), f.tokens.begin() + T);
  std::vector<int32_t> positions(static_cast<size_t>(T)), docs(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    positions[size_t(t)] = int32_t(t < A ? t : t - A);
    docs[size_t(t)] = t < A ? 0 : 1;
  }
  Batch packed{tokens.data(), nullptr, positions.data(), docs.data(), 1, T};
  Tensor lp = f.model->forward_logits(packed);
  Batch first{tokens.data(), nullptr, nullptr, nullptr, 1, A};
  Tensor l1 = f.model->forward_logits(first);
  Batch second{tokens.data() + A, nullptr, nullptr, nullptr, 1, T - A};
  Tensor l2 = f.model->forward_logits(second);
  EXPECT_LE(rel_error(lp.f32(), l1.f32(), A * V), 1e-5);
  EXPECT_LE(rel_error(lp.f32() + A * V, l2.f32(), (T - A) * V), 1e-5);
}

// RoPE is relative: shifting every position by the same amount (past the rotary table's first 4096
// rows, which then grows) leaves the logits unchanged up to the rounding of larger angles.
TEST_P(DecoderParity, ShiftedPositionsBeyondTheInitialTableGiveTheSameLogits) {
  Fixture f = load(GetParam());
  std::vector<int32_t> zero(static_cast<size_t>(f.T)), far(static_cast<size_t>(f.T));
  for (int64_t t = 0; t < f.T; ++t) {
    zero[size_t(t)] = int32_t(t);
    far[size_t(t)] = int32_t(t + 5000);
  }
  Batch a{f.tokens.data(), nullptr, zero.data(), nullptr, 1, f.T};
  Batch b{f.tokens.data(), nullptr, far.data(), nullptr, 1, f.T};
  Tensor la = f.model->forward_logits(a);
  Tensor lb = f.model->forward_logits(b);
  EXPECT_LE(rel_error(lb.f32(), la.f32(), la.numel()), 2e-3);
  std::vector<int32_t> negative(static_cast<size_t>(f.T), -1);
  Batch bad{f.tokens.data(), nullptr, negative.data(), nullptr, 1, f.T};
  EXPECT_THROW(f.model->forward_logits(bad), Error);
}

namespace {

// The fixture's f32 model with its weights rounded to bf16, and the same checkpoint stored in bf16.
struct Bf16Pair {
  Fixture f;
  std::unique_ptr<Decoder> m;
};
Bf16Pair load_bf16_pair(const std::string& family) {
  Bf16Pair pair{load(family), nullptr};
  for (Parameter* p : pair.f.model->parameters()) p->value.copy_from(p->value.to(DType::BF16));
  LoadOptions bf16;
  bf16.storage = DType::BF16;
  pair.m = Decoder::from_pretrained(fixture_dir(family), bf16);
  return pair;
}

}  // namespace

// bf16 storage with its weights widened to f32 for every GEMM (CPUs without bf16 units): the same
// results as f32 storage of the bf16-rounded weights, bar the gradients' rounding; half the bytes
// per weight; and still close to HF's f32 model.
TEST_P(DecoderParity, Bf16StorageMatchesF32OfRoundedWeights) {
  ScopedBf16Gemm widen("widen");
  auto [f, m] = load_bf16_pair(GetParam());
  EXPECT_EQ(m->storage(), DType::BF16);
  Tensor l32 = f.model->forward_logits(f.batch());
  Tensor l16 = m->forward_logits(f.batch());
  EXPECT_LE(rel_error(l16.f32(), l32.f32(), l32.numel()), 1e-6);
  EXPECT_LE(rel_error(l16.f32(), f.ref.view("logits").f32(), l32.numel()), 5e-2);
  const int64_t n = f.ref.view("n_valid").data<int64_t>()[0];
  LossResult r32 = f.model->forward_backward(f.batch(), 1.0f / float(n));
  LossResult r16 = m->forward_backward(f.batch(), 1.0f / float(n));
  EXPECT_NEAR(r16.loss_sum, r32.loss_sum, 1e-5 * r32.loss_sum);
  // Pure bf16: the gradients are bf16 too, each computed in f32 and rounded once per use (2^-9
  // relative; the tied embedding's two uses round twice).
  for (Parameter* p : m->parameters()) {
    ASSERT_EQ(p->value.dtype(), DType::BF16) << p->name;
    ASSERT_EQ(p->grad.dtype(), DType::BF16) << p->name;
    Parameter& q = f.model->parameter(p->name);
    Tensor g = p->grad.to(DType::F32);
    EXPECT_LE(rel_error(g.f32(), q.grad.f32(), q.grad.numel()), 8e-3) << p->name;
  }
}

// bf16 weights multiplied as bf16 (forced here, so the path runs on any CPU): the activations
// and activation gradients are rounded to bf16 for every GEMM, as PyTorch's bf16 does, so the figures
// are bf16's, not f32's. Measured (max error / max |f32 value|, worst of the four families): logits
// 5.6e-3, loss 2.2e-4 (relative), gradients 2.3e-2 (qwen2's k_proj bias, a sum over tokens of a
// gradient that went through bf16 GEMMs twice); the tolerances allow about twice that.
TEST_P(DecoderParity, Bf16GemmsTrackF32OfRoundedWeightsWithinBf16Rounding) {
  ScopedBf16Gemm native("bf16");
  auto [f, m] = load_bf16_pair(GetParam());
  Tensor l32 = f.model->forward_logits(f.batch());
  Tensor l16 = m->forward_logits(f.batch());
  const double logits_error = rel_error(l16.f32(), l32.f32(), l32.numel());
  const int64_t n = f.ref.view("n_valid").data<int64_t>()[0];
  LossResult r32 = f.model->forward_backward(f.batch(), 1.0f / float(n));
  LossResult r16 = m->forward_backward(f.batch(), 1.0f / float(n));
  double worst_grad = 0;
  std::string worst_name;
  for (Parameter* p : m->parameters()) {
    ASSERT_EQ(p->grad.dtype(), DType::BF16) << p->name;
    Parameter& q = f.model->parameter(p->name);
    Tensor g = p->grad.to(DType::F32);
    const double e = rel_error(g.f32(), q.grad.f32(), q.grad.numel());
    if (e > worst_grad) worst_grad = e, worst_name = p->name;
  }
  std::printf("%s: logits %.2e, loss %.2e, worst gradient %.2e (%s)\n", GetParam().c_str(), logits_error,
              std::fabs(r16.loss_sum - r32.loss_sum) / r32.loss_sum, worst_grad, worst_name.c_str());
  EXPECT_GT(logits_error, 0.0) << "the bf16 GEMMs ran (widening reproduces f32 exactly)";
  EXPECT_LE(logits_error, 1.5e-2);
  EXPECT_LE(rel_error(l16.f32(), f.ref.view("logits").f32(), l32.numel()), 5e-2) << "against transformers";
  EXPECT_NEAR(r16.loss_sum, r32.loss_sum, 5e-4 * r32.loss_sum);
  EXPECT_LE(worst_grad, 5e-2) << worst_name;
}

// The same model saved as a sharded bf16 checkpoint (HF names, index) loads to the same weights.
TEST_P(DecoderParity, ShardedBf16CheckpointLoads) {
  Fixture f = load(GetParam());
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("ktune_sharded_" + GetParam() + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fixture_dir(GetParam()) + "/config.json", dir / "config.json");
  std::vector<io::NamedTensor> tensors;
  for (Parameter* p : f.model->parameters()) tensors.push_back({p->name, p->value.to(DType::BF16)});
  auto written = io::write_safetensors_sharded(dir.string(), tensors, 64 * 1024);
  ASSERT_GT(written.size(), 2u);
  EXPECT_EQ(written.back(), "model.safetensors.index.json");
  std::unique_ptr<Decoder> m = Decoder::from_pretrained(dir.string());
  for (Parameter* p : m->parameters()) {
    Tensor expect = f.model->parameter(p->name).value.to(DType::BF16).to(DType::F32);
    ASSERT_EQ(p->value.dtype(), DType::F32);
    ASSERT_EQ(std::memcmp(p->value.raw(), expect.raw(), expect.bytes()), 0) << p->name;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, DecoderParity, ::testing::Values("llama", "qwen2", "mistral", "gemma2"),
                         [](const auto& info) { return info.param; });

TEST(Decoder, RandomInitTrainsDownOnARepeatedBatch) {
  // A tiny model from a config alone, trained with plain SGD on one batch: the loss must fall.
  ModelConfig c = ModelConfig::llama_like(50, 32, 2, 4, 2, 64);
  Decoder d(c, 7);
  std::vector<int32_t> tokens(2 * 8), labels(2 * 8);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = int32_t((i * 7) % 50);
    labels[i] = int32_t((i * 7 + 3) % 50);
  }
  Batch b{tokens.data(), labels.data(), nullptr, nullptr, 2, 8};
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    d.zero_grad();
    LossResult r = d.forward_backward(b, 1.0f / 16);
    if (step == 0) first = r.loss_sum / 16;
    last = r.loss_sum / 16;
    for (Parameter* p : d.parameters())
      for (int64_t i = 0; i < p->value.numel(); ++i) p->value.f32()[i] -= 0.5f * p->grad.f32()[i];
  }
  EXPECT_NEAR(first, std::log(50.0), 0.1);
  EXPECT_LT(last, 0.5 * first);
}

}  // namespace
