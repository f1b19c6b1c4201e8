// Tiled attention against the plain (T, T) reference for every feature and their combinations
// (GQA, sliding window, soft-capping, packed documents, T not a multiple of any tile), its
// backward against finite differences, the reference's against a hand-computed case, bad shapes.
#include "kernels/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "gradient_check.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

struct Case {
  std::string name;
  AttentionShape shape;
  bool docs;
  bool short_docs = false;  // documents of 23 tokens: most key tiles' queries end long before the row
};

std::vector<int32_t> make_short_docs(int64_t B, int64_t T) {
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) ids[size_t(b * T + i)] = int32_t(i / 23);
  return ids;
}

std::vector<int32_t> make_docs(int64_t B, int64_t T) {
  // Row 0: documents of lengths 5, 17, then the rest; row 1: one id repeating after a gap (0..0 1..1 0..0).
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i)
      ids[size_t(b * T + i)] = b % 2 == 0 ? (i < 5 ? 0 : i < 22 ? 1 : 2) : ((i / 13) % 2 == 0 ? 7 : 3);
  return ids;
}

void compare_with_reference(const Case& c) {
  const AttentionShape& s = c.shape;
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  auto q = random_vector(nq, 1, -2, 2), k = random_vector(nkv, 2, -2, 2), v = random_vector(nkv, 3);
  auto dout = random_vector(nq, 4);
  auto docs = c.short_docs ? make_short_docs(s.B, s.T) : make_docs(s.B, s.T);
  const int32_t* doc_ids = c.docs ? docs.data() : nullptr;
  std::vector<float> out(nq), out_ref(nq), lse(size_t(s.B * s.Hq * s.T)), lse_ref(lse.size());
  attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), doc_ids, s);
  attention_forward_reference(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), doc_ids, s);
  expect_close(out, out_ref, 2e-5, c.name + " out");
  expect_close(lse, lse_ref, 2e-6, c.name + " lse");
  std::vector<float> dq(nq, NAN), dk(nkv, NAN), dv(nkv, NAN), dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
  attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                     doc_ids, s);
  attention_backward_reference(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(), k.data(), v.data(),
                               out_ref.data(), lse_ref.data(), doc_ids, s);
  expect_close(dq, dq_ref, 5e-5, c.name + " dq", 1e-6);
  expect_close(dk, dk_ref, 5e-5, c.name + " dk", 1e-6);
  expect_close(dv, dv_ref, 5e-5, c.name + " dv", 1e-6);
}

}  // namespace

TEST(Attention, TiledMatchesReferenceAcrossFeatures) {
  const int64_t T = sanitized() ? 150 : 301;  // not a multiple of any tile
  const std::vector<Case> cases = {
      {"plain MHA", {2, T, 4, 4, 16, 0.25f}, false},
      {"GQA 8/2", {1, T, 8, 2, 32, 1.0f / std::sqrt(32.0f)}, false},
      {"MQA 3/1", {2, 70, 3, 1, 8, 0.35f}, false},
      {"window 40", {1, T, 4, 2, 16, 0.25f, 40}, false},
      {"window 1 (self only)", {1, 37, 2, 1, 8, 0.25f, 1}, false},
      {"softcap 5", {1, T, 2, 2, 16, 0.7f, 0, 5.0f}, false},
      {"documents", {2, T, 4, 2, 16, 0.25f}, true},
      {"everything", {2, T, 6, 3, 24, 0.3f, 64, 8.0f}, true},
      {"short documents", {2, T, 4, 2, 16, 0.25f}, true, true},
      {"short documents, window and cap", {1, T, 4, 1, 16, 0.25f, 10, 5.0f}, true, true},
      {"T=1", {3, 1, 2, 1, 8, 0.3f}, false},
      {"T=300 tile multiple", {1, 256, 2, 2, 64, 0.125f}, false},
  };
  for (const auto& c : cases) compare_with_reference(c);
}

TEST(Attention, BackwardSharedByKeyTileAcrossThreadsMatchesReference) {
  // Few (batch, kv head) pairs for the thread count: threads split key tiles and sum dQ buffers.
  const int saved = ktune::num_threads();
  for (int threads : {2, 3}) {
    ktune::set_num_threads(threads);
    compare_with_reference({"1 pair, " + std::to_string(threads) + " threads", {1, 200, 4, 1, 16, 0.25f, 50, 4.0f}, true});
    compare_with_reference({"5 pairs, " + std::to_string(threads) + " threads", {1, 300, 5, 5, 8, 0.3f}, false});
  }
  ktune::set_num_threads(saved);
}

TEST(Attention, ReferenceMatchesAHandComputedCase) {
  // T = 2, one head, D = 1: q = [1, 2], k = [1, -1], v = [10, 20], scale 1.
  // Token 0 sees only key 0: out 10. Token 1: scores 2, -2 -> p = softmax -> out = 10 p0 + 20 p1.
  AttentionShape s{1, 2, 1, 1, 1, 1.0f};
  std::vector<float> q = {1, 2}, k = {1, -1}, v = {10, 20}, out(2), lse(2);
  attention_forward_reference(out.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, s);
  const double p0 = std::exp(2.0) / (std::exp(2.0) + std::exp(-2.0));
  EXPECT_NEAR(out[0], 10.0, 1e-6);
  EXPECT_NEAR(out[1], 10 * p0 + 20 * (1 - p0), 1e-5);
  EXPECT_NEAR(lse[0], 1.0, 1e-6);
  EXPECT_NEAR(lse[1], std::log(std::exp(2.0) + std::exp(-2.0)), 1e-6);
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (bool features : {false, true}) {
    AttentionShape s{1, 11, 4, 2, 6, 0.4f};
    if (features) {
      s.sliding_window = 4;
      s.softcap = 3.0f;
    }
    std::vector<int32_t> docs = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2};
    const int32_t* doc_ids = features ? docs.data() : nullptr;
    const size_t nq = size_t(s.T * s.Hq * s.D), nkv = size_t(s.T * s.Hkv * s.D);
    auto q = random_vector(nq, 5, -1.5f, 1.5f), k = random_vector(nkv, 6, -1.5f, 1.5f), v = random_vector(nkv, 7);
    auto r = random_vector(nq, 8);
    // The loss through the reference forward (double inside); the tiled forward is proven equal to it above.
    auto loss = [&] {
      std::vector<float> out(nq), lse(size_t(s.Hq * s.T));
      attention_forward_reference(out.data(), lse.data(), q.data(), k.data(), v.data(), doc_ids, s);
      return dot(out, r);
    };
    std::vector<float> out(nq), lse(size_t(s.Hq * s.T)), dq(nq), dk(nkv), dv(nkv);
    attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), doc_ids, s);
    attention_backward(dq.data(), dk.data(), dv.data(), r.data(), q.data(), k.data(), v.data(), out.data(), lse.data(),
                       doc_ids, s);
    const std::string tag = features ? " (window, softcap, docs)" : " (plain)";
    const size_t coords = sanitized() ? 12 : 48;
    expect_gradient_matches_finite_differences(loss, q, dq, "dq" + tag, 1e-2, 2e-3, coords);
    expect_gradient_matches_finite_differences(loss, k, dk, "dk" + tag, 1e-2, 2e-3, coords);
    expect_gradient_matches_finite_differences(loss, v, dv, "dv" + tag, 1e-2, 2e-3, coords);
    std::vector<float> dq_ref(nq), dk_ref(nkv), dv_ref(nkv);
    attention_backward_reference(dq_ref.data(), dk_ref.data(), dv_ref.data(), r.data(), q.data(), k.data(), v.data(),
                                 out.data(), lse.data(), doc_ids, s);
    expect_gradient_matches_finite_differences(loss, q, dq_ref, "reference dq" + tag, 1e-2, 2e-3, coords);
    expect_gradient_matches_finite_differences(loss, k, dk_ref, "reference dk" + tag, 1e-2, 2e-3, coords);
  }
}

TEST(Attention, DocumentsDoNotSeeEachOther) {
  // Changing keys/values of document 0 must not change the outputs of document 1.
  AttentionShape s{1, 20, 2, 1, 8, 0.3f};
  std::vector<int32_t> docs(20, 1);
  for (int i = 0; i < 8; ++i) docs[size_t(i)] = 0;
  auto q = random_vector(size_t(20 * 2 * 8), 9), k = random_vector(size_t(20 * 8), 10), v = random_vector(size_t(20 * 8), 11);
  std::vector<float> out1(q.size()), out2(q.size()), lse(40);
  attention_forward(out1.data(), lse.data(), q.data(), k.data(), v.data(), docs.data(), s);
  for (int i = 0; i < 8 * 8; ++i) {
    k[size_t(i)] += 1.0f;
    v[size_t(i)] -= 2.0f;
  }
  attention_forward(out2.data(), lse.data(), q.data(), k.data(), v.data(), docs.data(), s);
  for (size_t i = 8 * 2 * 8; i < q.size(); ++i) EXPECT_EQ(out1[i], out2[i]) << i;
}

TEST(Attention, RejectsHeadsThatDoNotGroup) {
  AttentionShape s{1, 4, 3, 2, 8, 1.0f};
  std::vector<float> buf(1024);
  EXPECT_THROW(attention_forward(buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), nullptr, s), ktune::Error);
}
