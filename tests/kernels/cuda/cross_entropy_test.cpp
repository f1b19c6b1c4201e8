// The fused linear + cross-entropy on the GPU against the CPU reference (every logit in double) on
// the same bf16-rounded hidden states and weights, over several chunks (the last one partial),
// with ignored tokens, with and without the final-logit soft-cap, and with LoRA on the head.
// Tolerances: the loss uses f32 logits of exact bf16 products: 1e-5 relative. The gradients go
// through dlogits rounded to bf16 (relative 2^-9) for the backward GEMMs, so an element of dhidden
// (a sum over V of g_c w_c, sum |g_c| <= 2 grad_scale, |w| <= 1) is off by at most
// 2^-9 * 2 * grad_scale = 2e-3 for grad_scale 0.5; dweight sums over tokens likewise.
#include <string>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cuda/cross_entropy.h"

namespace ktune {
namespace {

using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::to_device;

void check_fused_loss(float softcap) {
  const int64_t N = 70, C = 64, V = 300, chunk = 32;
  const float grad_scale = 0.5f;
  auto hidden = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 1));
  auto weight = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(V * C), 2));
  std::mt19937 rng(3);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (auto& l : labels) l = (rng() % 5 == 0) ? cpu::kIgnoreIndex : int32_t(rng() % uint32_t(V));
  std::vector<float> dhidden(hidden.size()), dweight0 = random_floats(weight.size(), 4), dweight = dweight0;
  int64_t want_valid = 0;
  const double want = cpu::linear_cross_entropy_reference(dhidden.data(), dweight.data(), &want_valid, hidden.data(),
                                                          weight.data(), labels.data(), N, C, V, softcap, grad_scale);

  auto d_h = to_device(cuda_test::to_bf16(hidden)), d_w = to_device(cuda_test::to_bf16(weight));
  auto d_labels = to_device(labels), d_dw = to_device(dweight0);
  cuda::DeviceBuffer d_dh(hidden.size() * 4), scratch(cuda::linear_cross_entropy_scratch_bytes(chunk, V));
  cuda::GemmContext ctx;
  int64_t got_valid = -1;
  const double got = cuda::linear_cross_entropy(ctx, d_dh.as<float>(), d_dw.as<float>(), &got_valid, d_h.as<bf16_t>(),
                                                d_w.as<bf16_t>(), d_labels.as<int32_t>(), N, C, V, softcap, grad_scale,
                                                chunk, scratch.data());
  CHECK(got_valid == want_valid) << got_valid << " vs " << want_valid;
  CHECK(std::fabs(got - want) <= 1e-5 * std::fabs(want)) << "loss " << got << " vs " << want << " softcap " << softcap;
  auto got_dh = from_device<float>(d_dh, dhidden.size()), got_dw = from_device<float>(d_dw, dweight.size());
  CHECK_CLOSE(got_dh.data(), dhidden.data(), int64_t(dhidden.size()), 2e-3, 0.0) << "softcap " << softcap;
  CHECK_CLOSE(got_dw.data(), dweight.data(), int64_t(dweight.size()), 4e-3, 0.0) << "softcap " << softcap;
  for (int64_t r = 0; r < N; ++r) {
    if (labels[size_t(r)] != cpu::kIgnoreIndex) continue;
    for (int64_t c = 0; c < C; ++c) {
      CHECK(got_dh[size_t(r * C + c)] == 0.0f) << "ignored row " << r;
    }
  }
}

KTUNE_CUDA_TEST(FusedLinearCrossEntropyMatchesCpuReferenceOverChunks) { check_fused_loss(0.0f); }

KTUNE_CUDA_TEST(FusedLinearCrossEntropyWithFinalLogitSoftcapMatchesCpuReference) { check_fused_loss(2.0f); }

// LoRA on the head (LoraHead): logits = h Wᵀ + s · xa Bᵀ. The reference is the same fused loss over the
// concatenations [h | s xa] (N, C + r) and [W | B] (V, C + r), whose logits are exactly these: its
// hidden gradient holds dh (the first C columns) and dlogits B (the last r, times s: dxa), its weight
// gradient dW and s dlogitsᵀ xa = dB. dxa is rounded to bf16 (2^-9 of |dxa| <= 2 s grad_scale).
void check_fused_loss_with_lora(float softcap) {
  const int64_t N = 70, C = 64, V = 300, r = 8, K = C + r, chunk = 32;
  const float grad_scale = 0.5f, s = 2.0f;
  auto hidden = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 11));
  auto weight = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(V * C), 12, -0.5f, 0.5f));
  auto xa = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * r), 13));
  auto lora_b = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(V * r), 14, -0.5f, 0.5f));
  std::mt19937 rng(15);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (auto& l : labels) l = (rng() % 5 == 0) ? cpu::kIgnoreIndex : int32_t(rng() % uint32_t(V));
  std::vector<float> hk(static_cast<size_t>(N * K)), wk(static_cast<size_t>(V * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      hk[size_t(n * K + k)] = k < C ? hidden[size_t(n * C + k)] : s * xa[size_t(n * r + k - C)];
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; ++k)
      wk[size_t(v * K + k)] = k < C ? weight[size_t(v * C + k)] : lora_b[size_t(v * r + k - C)];
  std::vector<float> dhk(hk.size()), dwk(wk.size(), 0.0f);
  const double want = cpu::linear_cross_entropy_reference(dhk.data(), dwk.data(), nullptr, hk.data(), wk.data(),
                                                          labels.data(), N, K, V, softcap, grad_scale);
  std::vector<float> want_dh(hidden.size()), want_dxa(xa.size()), want_dw(weight.size()), want_db(lora_b.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      (k < C ? want_dh[size_t(n * C + k)] : want_dxa[size_t(n * r + k - C)]) =
          (k < C ? 1.0f : s) * dhk[size_t(n * K + k)];
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; ++k)
      (k < C ? want_dw[size_t(v * C + k)] : want_db[size_t(v * r + k - C)]) = dwk[size_t(v * K + k)];

  auto d_h = to_device(cuda_test::to_bf16(hidden)), d_w = to_device(cuda_test::to_bf16(weight));
  auto d_xa = to_device(cuda_test::to_bf16(xa)), d_b = to_device(cuda_test::to_bf16(lora_b));
  auto d_labels = to_device(labels), d_dw = to_device(std::vector<float>(weight.size(), 0.0f));
  auto d_db = to_device(std::vector<float>(lora_b.size(), 0.0f));
  cuda::DeviceBuffer d_dh(hidden.size() * 4), d_dxa(xa.size() * 2);
  cuda::DeviceBuffer scratch(cuda::linear_cross_entropy_scratch_bytes(chunk, V));
  cuda::LoraHead lora;
  lora.rank = r, lora.scale = s, lora.b = d_b.as<bf16_t>(), lora.xa = d_xa.as<bf16_t>();
  lora.dxa = d_dxa.as<bf16_t>(), lora.db = d_db.as<float>();
  cuda::GemmContext ctx;
  const double got = cuda::linear_cross_entropy(ctx, d_dh.as<float>(), d_dw.as<float>(), nullptr, d_h.as<bf16_t>(),
                                                d_w.as<bf16_t>(), lora, d_labels.as<int32_t>(), N, C, V, softcap,
                                                grad_scale, chunk, scratch.data());
  CHECK(std::fabs(got - want) <= 1e-5 * std::fabs(want)) << "loss " << got << " vs " << want << " softcap " << softcap;
  auto got_dh = from_device<float>(d_dh, want_dh.size()), got_dw = from_device<float>(d_dw, want_dw.size());
  auto got_db = from_device<float>(d_db, want_db.size());
  auto got_dxa = cuda_test::from_bf16(from_device<bf16_t>(d_dxa, want_dxa.size()));
  CHECK_CLOSE(got_dh.data(), want_dh.data(), int64_t(want_dh.size()), 2e-3, 0.0) << "dhidden, softcap " << softcap;
  CHECK_CLOSE(got_dw.data(), want_dw.data(), int64_t(want_dw.size()), 4e-3, 0.0) << "dW, softcap " << softcap;
  CHECK_CLOSE(got_dxa.data(), want_dxa.data(), int64_t(want_dxa.size()), 1e-2, 0.0) << "dxa, softcap " << softcap;
  CHECK_CLOSE(got_db.data(), want_db.data(), int64_t(want_db.size()), 1e-2, 0.0) << "dB, softcap " << softcap;
}

KTUNE_CUDA_TEST(FusedLinearCrossEntropyWithLoraHeadMatchesCpuReference) {
  check_fused_loss_with_lora(0.0f);
  check_fused_loss_with_lora(2.0f);
}

KTUNE_CUDA_TEST(FusedLinearCrossEntropyRejectsALabelOutsideTheVocabulary) {
  const int64_t N = 4, C = 16, V = 10;
  std::vector<int32_t> labels = {1, -100, 10, 2};
  auto d_h = to_device(cuda_test::to_bf16(random_floats(static_cast<size_t>(N * C), 5)));
  auto d_w = to_device(cuda_test::to_bf16(random_floats(static_cast<size_t>(V * C), 6)));
  auto d_labels = to_device(labels);
  cuda::DeviceBuffer scratch(cuda::linear_cross_entropy_scratch_bytes(4, V));
  cuda::GemmContext ctx;
  std::string message;
  try {
    cuda::linear_cross_entropy(ctx, nullptr, nullptr, nullptr, d_h.as<bf16_t>(), d_w.as<bf16_t>(),
                               d_labels.as<int32_t>(), N, C, V, 0.0f, 1.0f, 4, scratch.data());
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("token 2") != std::string::npos) << "got: '" << message << "'";
}

}  // namespace
}  // namespace ktune
