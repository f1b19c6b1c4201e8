// The fused linear + cross-entropy on the GPU against the CPU reference (every logit in double) on
// the same bf16-rounded hidden states and weights, over several chunks (the last one partial),
// with ignored tokens, with and without the final-logit soft-cap, and with LoRA (and DoRA, on an NF4 W)
// on the head.
// Tolerances: the loss uses f32 logits of exact bf16 products: 1e-5 relative. The gradients go
// through dlogits rounded to bf16 (relative 2^-9) for the backward GEMMs, so an element of dhidden
// (a sum over V of g_c w_c, sum |g_c| <= 2 grad_scale, |w| <= 1) is off by at most
// 2^-9 * 2 * grad_scale = 2e-3 for grad_scale 0.5; dweight sums over tokens likewise.
#include <string>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/nf4.h"
#include "kernels/cuda/cross_entropy.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/nf4.h"

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

// DoRA on the head (LoraHead::dora_scale, the CPU OutputHead's math), its W as NF4 dequantised in
// blocks of 64 vocabulary rows (64 x 4 + 44): logits = c ⊙ (h Wᵀ + s xa Bᵀ), with dropped rows h'
// h Wᵀ − h' Wᵀ + c ⊙ (h' Wᵀ + s xa Bᵀ). The reference is the fused loss over [h (− h') | (h') | s xa]
// against [(c) W | (c W) | c B], whose logits are exactly these: dhidden = the first block's hidden
// gradient, d h' = the h' block's minus the first's, dxa = s · the B block's, dB = c ⊙ its weight
// gradient, dm = (the pre blocks' weight gradients · [W | B]) / norm (the norm detached). Then the
// same call on W whole (the NF4 values as bf16) gives the same loss, dxa, dB and dm bits.
void check_fused_loss_with_dora(float softcap, bool dropped) {
  const int64_t N = 70, C = 64, V = 300, r = 8, block = 64, chunk = 32;
  const int64_t Kb = dropped ? 2 * C : C, K = Kb + r;  // the B block starts at Kb
  const float grad_scale = 0.5f, s = 2.0f;
  auto hidden = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 21));
  auto hd = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * C), 22));
  const std::vector<float> w0 = random_floats(static_cast<size_t>(V * C), 23, -0.5f, 0.5f);
  std::vector<uint8_t> codes(w0.size() / 2);
  std::vector<float> scales(w0.size() / 64), weight(w0.size());
  cpu::nf4_quantize(codes.data(), scales.data(), w0.data(), V * C, cpu::Nf4Arithmetic::kBf16);
  cpu::nf4_dequantize(weight.data(), codes.data(), scales.data(), V * C, cpu::Nf4Arithmetic::kBf16);  // what the GEMMs read
  auto xa = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(N * r), 24));
  auto lora_b = cuda_test::rounded_to_bf16(random_floats(static_cast<size_t>(V * r), 25, -0.5f, 0.5f));
  const std::vector<float> c = random_floats(static_cast<size_t>(V), 26, 0.8f, 1.2f);
  const std::vector<float> norm = random_floats(static_cast<size_t>(V), 27, 0.5f, 1.5f);
  std::mt19937 rng(28);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (auto& l : labels) l = (rng() % 5 == 0) ? cpu::kIgnoreIndex : int32_t(rng() % uint32_t(V));
  std::vector<float> hk(static_cast<size_t>(N * K)), wk(static_cast<size_t>(V * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const size_t i = size_t(n * C + k % C);
      hk[size_t(n * K + k)] = k >= Kb ? s * xa[size_t(n * r + k - Kb)] : k >= C ? hd[i] : hidden[i] - (dropped ? hd[i] : 0);
    }
  for (int64_t v = 0; v < V; ++v)
    for (int64_t k = 0; k < K; ++k)
      wk[size_t(v * K + k)] = k >= Kb ? c[size_t(v)] * lora_b[size_t(v * r + k - Kb)]
                                      : (k < C && dropped ? 1.0f : c[size_t(v)]) * weight[size_t(v * C + k % C)];
  std::vector<float> dhk(hk.size()), dwk(wk.size(), 0.0f);
  const double want = cpu::linear_cross_entropy_reference(dhk.data(), dwk.data(), nullptr, hk.data(), wk.data(),
                                                          labels.data(), N, K, V, softcap, grad_scale);
  std::vector<float> want_dh(hidden.size()), want_dhd(hidden.size()), want_dxa(xa.size()), want_db(lora_b.size());
  std::vector<float> want_dm(static_cast<size_t>(V));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const float d = dhk[size_t(n * K + k)];
      if (k >= Kb) want_dxa[size_t(n * r + k - Kb)] = s * d;
      else if (k < C) want_dh[size_t(n * C + k)] = d;
      else want_dhd[size_t(n * C + k - C)] = d - dhk[size_t(n * K + k - C)];
    }
  for (int64_t v = 0; v < V; ++v) {
    double dm = 0;
    for (int64_t k = Kb - C; k < K; ++k) {
      const float d = dwk[size_t(v * K + k)];
      if (k >= Kb) want_db[size_t(v * r + k - Kb)] = c[size_t(v)] * d;
      dm += double(d) * (k >= Kb ? lora_b[size_t(v * r + k - Kb)] : weight[size_t(v * C + k - (Kb - C))]);
    }
    want_dm[size_t(v)] = float(dm / norm[size_t(v)]);
  }

  auto d_h = to_device(cuda_test::to_bf16(hidden)), d_hd = to_device(cuda_test::to_bf16(hd));
  auto d_w = to_device(cuda_test::to_bf16(weight)), d_codes = to_device(codes), d_scales = to_device(cuda_test::to_bf16(scales));  // bf16 values, held as bf16
  auto d_xa = to_device(cuda_test::to_bf16(xa)), d_b = to_device(cuda_test::to_bf16(lora_b));
  auto d_c = to_device(c), d_norm = to_device(norm), d_labels = to_device(labels);
  cuda::DeviceBuffer d_block(size_t(block * C) * 2);
  cuda::DeviceBuffer scratch(cuda::linear_cross_entropy_scratch_bytes(chunk, V, dropped));
  cuda::GemmContext ctx;
  struct Got {
    double loss;
    std::vector<float> dh, dhd, dxa, db, dm;
  };
  auto run = [&](bool nf4) {
    cuda::DeviceBuffer d_dh(hidden.size() * 4), d_dhd(hidden.size() * 4), d_dxa(xa.size() * 2);
    auto d_db = to_device(std::vector<float>(lora_b.size(), 0.0f)), d_dm = to_device(std::vector<float>(V, 0.0f));
    cuda::LoraHead lora;
    lora.rank = r, lora.scale = s, lora.b = d_b.as<bf16_t>(), lora.xa = d_xa.as<bf16_t>();
    lora.dxa = d_dxa.as<bf16_t>(), lora.db = d_db.as<float>();
    lora.dora_scale = d_c.as<float>(), lora.weight_norm = d_norm.as<float>(), lora.dmagnitude = d_dm.as<float>();
    if (dropped) lora.dropped_hidden = d_hd.as<bf16_t>(), lora.ddropped_hidden = d_dhd.as<float>();
    if (nf4) {
      lora.nf4_codes = d_codes.as<uint8_t>(), lora.nf4_scales = d_scales.as<bf16_t>();
      lora.nf4_block_rows = block, lora.nf4_block = d_block.as<bf16_t>();
    }
    Got got;
    got.loss = cuda::linear_cross_entropy(ctx, d_dh.as<float>(), nullptr, nullptr, d_h.as<bf16_t>(),
                                          nf4 ? nullptr : d_w.as<bf16_t>(), lora, d_labels.as<int32_t>(), N, C, V,
                                          softcap, grad_scale, chunk, scratch.data());
    got.dh = from_device<float>(d_dh, hidden.size());
    got.dhd = dropped ? from_device<float>(d_dhd, hidden.size()) : std::vector<float>();
    got.dxa = cuda_test::from_bf16(from_device<bf16_t>(d_dxa, xa.size()));
    got.db = from_device<float>(d_db, lora_b.size());
    got.dm = from_device<float>(d_dm, size_t(V));
    return got;
  };
  const Got got = run(true), whole = run(false);
  const std::string what = std::string(dropped ? "dropout" : "no dropout") + ", softcap " + std::to_string(softcap);
  CHECK(std::fabs(got.loss - want) <= 1e-5 * std::fabs(want)) << "loss " << got.loss << " vs " << want << ", " << what;
  CHECK_CLOSE(got.dh.data(), want_dh.data(), int64_t(want_dh.size()), 4e-3, 0.0) << "dhidden, " << what;
  if (dropped) {
    CHECK_CLOSE(got.dhd.data(), want_dhd.data(), int64_t(want_dhd.size()), 4e-3, 0.0) << "dh', " << what;
  }
  CHECK_CLOSE(got.dxa.data(), want_dxa.data(), int64_t(want_dxa.size()), 1e-2, 0.0) << "dxa, " << what;
  CHECK_CLOSE(got.db.data(), want_db.data(), int64_t(want_db.size()), 1e-2, 0.0) << "dB, " << what;
  CHECK_CLOSE(got.dm.data(), want_dm.data(), int64_t(want_dm.size()), 1e-2, 0.0) << "dm, " << what;
  // On a GPU cuBLASLt may pick another algorithm for a block's narrower GEMM: the same bits on the emulator only.
  if (cuda::device_description().find("emulator") != std::string::npos) {
    CHECK(got.loss == whole.loss && got.dxa == whole.dxa && got.db == whole.db && got.dm == whole.dm)
        << "NF4 in blocks of " << block << " rows against W whole: not the same bits, " << what;
  }
  // The blocks' dequantisation itself is exact anywhere: block by block equals whole.
  cuda::DeviceBuffer d_whole(weight.size() * 2);
  cuda::nf4_dequantize(d_whole.as<bf16_t>(), d_codes.as<uint8_t>(), d_scales.as<bf16_t>(), V * C);
  std::vector<bf16_t> blocks(weight.size());
  for (int64_t v0 = 0; v0 < V; v0 += block) {
    const int64_t rows = std::min(block, V - v0);
    cuda::nf4_dequantize(d_block.as<bf16_t>(), d_codes.as<uint8_t>() + v0 * C / 2, d_scales.as<bf16_t>() + v0 * C / 64,
                         rows * C);
    const std::vector<bf16_t> part = from_device<bf16_t>(d_block, size_t(rows * C));
    std::copy(part.begin(), part.end(), blocks.begin() + v0 * C);
  }
  CHECK(blocks == from_device<bf16_t>(d_whole, weight.size())) << "NF4 dequantised in blocks of " << block << " rows";
}

KTUNE_CUDA_TEST(FusedLinearCrossEntropyWithDoraHeadMatchesCpuReference) {
  check_fused_loss_with_dora(0.0f, false);
  check_fused_loss_with_dora(2.0f, true);
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

// The enqueue-only form leaves its sum and count in the caller's totals buffer, apart from the
// scratch: they equal the synchronous form's bit for bit after the scratch has been overwritten, and
// a bad label is named when the totals are read, not when the pass is enqueued.
KTUNE_CUDA_TEST(FusedLinearCrossEntropyEnqueuedLeavesItsTotalsOutsideTheScratch) {
  const int64_t N = 70, C = 64, V = 300, chunk = 32;
  auto d_h = to_device(cuda_test::to_bf16(cuda_test::rounded_to_bf16(random_floats(size_t(N * C), 7))));
  auto d_w = to_device(cuda_test::to_bf16(cuda_test::rounded_to_bf16(random_floats(size_t(V * C), 8))));
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (size_t i = 0; i < labels.size(); ++i) labels[i] = i % 7 == 3 ? cpu::kIgnoreIndex : int32_t(i * 37 % V);
  auto d_labels = to_device(labels);
  cuda::DeviceBuffer scratch(cuda::linear_cross_entropy_scratch_bytes(chunk, V)),
      totals(cuda::linear_cross_entropy_totals_bytes());
  cuda::GemmContext ctx;
  int64_t want_valid = -1;
  const double want = cuda::linear_cross_entropy(ctx, nullptr, nullptr, &want_valid, d_h.as<bf16_t>(),
                                                 d_w.as<bf16_t>(), d_labels.as<int32_t>(), N, C, V, 0.0f, 1.0f, chunk,
                                                 scratch.data());
  cuda::linear_cross_entropy_enqueue(ctx, nullptr, nullptr, d_h.as<bf16_t>(), d_w.as<bf16_t>(), cuda::LoraHead{},
                                     d_labels.as<int32_t>(), N, C, V, 0.0f, 1.0f, chunk, scratch.data(), totals.data());
  const std::vector<unsigned char> other(cuda::linear_cross_entropy_scratch_bytes(chunk, V), 0x5a);
  scratch.upload(other.data(), other.size());  // the scratch reused before the totals are read
  const cuda::CrossEntropyTotals got = cuda::linear_cross_entropy_totals(totals.data(), V);
  CHECK(got.n_valid == want_valid && got.loss_sum == want)
      << "enqueued " << got.loss_sum << " over " << got.n_valid << " vs " << want << " over " << want_valid;

  labels[2] = int32_t(V);  // outside the vocabulary
  auto d_bad = to_device(labels);
  cuda::linear_cross_entropy_enqueue(ctx, nullptr, nullptr, d_h.as<bf16_t>(), d_w.as<bf16_t>(), cuda::LoraHead{},
                                     d_bad.as<int32_t>(), N, C, V, 0.0f, 1.0f, chunk, scratch.data(), totals.data());
  std::string message;
  try {
    cuda::linear_cross_entropy_totals(totals.data(), V);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("token 2") != std::string::npos) << "got: '" << message << "'";
}

}  // namespace
}  // namespace ktune
