// Tiled attention on the GPU against the CPU reference (full (T, T) scores per head in double,
// src/kernels/cpu/attention_reference.cpp) on the same inputs: causal, GQA, sliding window,
// soft-cap, document ids, head dims that are and are not multiples of 32, several tiles and blocks.
// With document ids the kernel runs with DocumentBounds (skipping the tiles wholly in other documents)
// against the reference, and without them: both must give the same bits (the kernel is deterministic).
// AttentionSkipsTilesByDocumentBounds shows the tiles are really skipped: masked as one document but
// bounded as several, the kernel gives the several's results (this kernel never multiplies a masked
// entry, so NaN in the skipped rows could not tell).
// Tolerances. f32: the GPU sums D products and T keys in f32 (relative ~1e-6 of sums of magnitude
// ~1): atol 2e-5, rtol 1e-4 everywhere. bf16: inputs are rounded before both see them, outputs are
// rounded once (relative 2^-9: rtol 1e-2 leaves headroom), and the backward's rowsum(dout * out)
// uses the bf16-rounded out (as flash-attention does) where the reference uses P dP in double:
// that costs ~2^-9 |dout . out| * scale per (query, key) pair, summed over up to T queries for dk
// (random signs: ~1e-3 in the worst rows here), so gradients get atol 4e-3 (a wrong mask or
// a wrong softmax is off by 0.1 or more).
#include <cmath>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "packed_documents.h"

namespace ktune {
namespace {

using cuda_test::from_bf16;
using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::rounded_to_bf16;
using cuda_test::to_bf16;
using cuda_test::to_device;

// The kernel's inputs (f32, or the floats a bf16 run sees) and its results, downloaded as floats.
struct TiledInputs {
  std::vector<float> q, k, v, dout;
};
struct TiledResults {
  std::vector<float> out, lse, dq, dk, dv;
};

// The tiled kernel's forward, then its backward on that forward's (out, lse), in f32 or bf16.
TiledResults run_tiled(const TiledInputs& in, const int32_t* d_docs, cuda::DocumentBounds bounds,
                       const cpu::AttentionShape& s, bool bf16) {
  const size_t nq = in.q.size(), nkv = in.k.size(), nlse = size_t(s.B * s.Hq * s.T);
  cuda::DeviceBuffer d_lse(nlse * 4), scratch(size_t(cuda::attention_backward_scratch_floats(s)) * 4);
  TiledResults r;
  if (!bf16) {
    auto d_q = to_device(in.q), d_k = to_device(in.k), d_v = to_device(in.v), d_dout = to_device(in.dout);
    cuda::DeviceBuffer d_out(nq * 4), d_dq(nq * 4), d_dk(nkv * 4), d_dv(nkv * 4);
    cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_q.as<float>(), d_k.as<float>(), d_v.as<float>(),
                            d_docs, bounds, s);
    cuda::attention_backward(d_dq.as<float>(), d_dk.as<float>(), d_dv.as<float>(), d_dout.as<float>(),
                             d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), d_out.as<float>(), d_lse.as<float>(),
                             d_docs, bounds, s, scratch.as<float>());
    r.out = from_device<float>(d_out, nq), r.dq = from_device<float>(d_dq, nq);
    r.dk = from_device<float>(d_dk, nkv), r.dv = from_device<float>(d_dv, nkv);
  } else {
    auto d_q = to_device(to_bf16(in.q)), d_k = to_device(to_bf16(in.k)), d_v = to_device(to_bf16(in.v));
    auto d_dout = to_device(to_bf16(in.dout));
    cuda::DeviceBuffer d_out(nq * 2), d_dq(nq * 2), d_dk(nkv * 2), d_dv(nkv * 2);
    cuda::attention_forward(d_out.as<bf16_t>(), d_lse.as<float>(), d_q.as<bf16_t>(), d_k.as<bf16_t>(),
                            d_v.as<bf16_t>(), d_docs, bounds, s);
    cuda::attention_backward(d_dq.as<bf16_t>(), d_dk.as<bf16_t>(), d_dv.as<bf16_t>(), d_dout.as<bf16_t>(),
                             d_q.as<bf16_t>(), d_k.as<bf16_t>(), d_v.as<bf16_t>(), d_out.as<bf16_t>(),
                             d_lse.as<float>(), d_docs, bounds, s, scratch.as<float>());
    r.out = from_bf16(from_device<bf16_t>(d_out, nq)), r.dq = from_bf16(from_device<bf16_t>(d_dq, nq));
    r.dk = from_bf16(from_device<bf16_t>(d_dk, nkv)), r.dv = from_bf16(from_device<bf16_t>(d_dv, nkv));
  }
  r.lse = from_device<float>(d_lse, nlse);
  return r;
}

void check_identical(const TiledResults& got, const TiledResults& want, const std::string& what) {
  cuda_test::check_identical(got.out, want.out, what + " out");
  cuda_test::check_identical(got.lse, want.lse, what + " lse");
  cuda_test::check_identical(got.dq, want.dq, what + " dq");
  cuda_test::check_identical(got.dk, want.dk, what + " dk");
  cuda_test::check_identical(got.dv, want.dv, what + " dv");
}

// Document layouts: kThree, three documents a row of uneven lengths; kPacked, a packed batch's:
// document 0 the first token alone, 1 to T/3, 2 to T - T/8 - b, then the row's padding (doc id -1);
// kShort, cuda_test::short_documents (many short documents, one document, recurring ids, padding).
enum class Docs { kNone, kThree, kPacked, kShort };

std::vector<int32_t> doc_ids(Docs docs, int64_t B, int64_t T) {
  if (docs == Docs::kShort) return cuda_test::short_documents(B, T);
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B && docs != Docs::kNone; ++b)
    for (int64_t i = 0; i < T; ++i) {
      if (docs == Docs::kThree) ids.push_back(i < T / 5 ? 7 : (i < T / 2 + b ? 8 : 9));
      else ids.push_back(i == 0 ? 0 : i < T / 3 ? 1 : i < T - T / 8 - b ? 2 : -1);
    }
  return ids;
}

void check_attention(const char* name, cpu::AttentionShape s, Docs with_docs_layout, bool bf16) {
  const bool with_docs = with_docs_layout != Docs::kNone;
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  auto q = random_floats(nq, 1), k = random_floats(nkv, 2), v = random_floats(nkv, 3), dout = random_floats(nq, 4);
  if (bf16) q = rounded_to_bf16(q), k = rounded_to_bf16(k), v = rounded_to_bf16(v), dout = rounded_to_bf16(dout);
  const std::vector<int32_t> docs = doc_ids(with_docs_layout, s.B, s.T);
  const int32_t* doc_ptr = with_docs ? docs.data() : nullptr;
  std::vector<float> out(nq), lse(size_t(s.B * s.Hq * s.T)), dq(nq), dk(nkv), dv(nkv);
  cpu::attention_forward_reference(out.data(), lse.data(), q.data(), k.data(), v.data(), doc_ptr, s);
  cpu::attention_backward_reference(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                    out.data(), lse.data(), doc_ptr, s);

  cuda::DeviceBuffer d_docs = with_docs ? to_device(docs) : cuda::DeviceBuffer();
  const int32_t* d_doc_ptr = with_docs ? d_docs.as<int32_t>() : nullptr;
  // With doc ids: bounded (checked below against the reference), and unbounded (the same bits).
  const auto bounds = with_docs ? cuda_test::device_document_bounds(docs, s.B, s.T) : cuda_test::DeviceDocumentBounds();
  const TiledInputs in{q, k, v, dout};
  const TiledResults got = run_tiled(in, d_doc_ptr, with_docs ? bounds.view() : cuda::DocumentBounds{}, s, bf16);
  if (with_docs) check_identical(run_tiled(in, d_doc_ptr, {}, s, bf16), got, std::string(name) + " without bounds");
  const double out_atol = bf16 ? 1e-5 : 2e-5, out_rtol = bf16 ? 1e-2 : 1e-4;
  const double grad_atol = bf16 ? 4e-3 : 2e-5, grad_rtol = bf16 ? 1e-2 : 1e-4;
  const char* type = bf16 ? " bf16" : " f32";
  CHECK_CLOSE(got.out.data(), out.data(), int64_t(nq), out_atol, out_rtol) << name << type;
  CHECK_CLOSE(got.lse.data(), lse.data(), int64_t(lse.size()), 2e-5, 1e-5) << name << type;
  CHECK_CLOSE(got.dq.data(), dq.data(), int64_t(nq), grad_atol, grad_rtol) << name << type;
  CHECK_CLOSE(got.dk.data(), dk.data(), int64_t(nkv), grad_atol, grad_rtol) << name << type;
  CHECK_CLOSE(got.dv.data(), dv.data(), int64_t(nkv), grad_atol, grad_rtol) << name << type;
}

cpu::AttentionShape shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  return cpu::AttentionShape{B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D)))};
}

KTUNE_CUDA_TEST(AttentionCausalGqaMatchesCpuReference) {
  for (bool bf16 : {false, true}) {
    check_attention("causal gqa 4:2 D64", shape(2, 77, 4, 2, 64), Docs::kNone, bf16);
    check_attention("causal mqa 4:1 D48", shape(1, 100, 4, 1, 48), Docs::kNone, bf16);  // D not a multiple of 32
    check_attention("causal mha D128", shape(1, 70, 2, 2, 128), Docs::kNone, bf16);
  }
}

KTUNE_CUDA_TEST(AttentionSlidingWindowAndSoftcapMatchCpuReference) {
  for (bool bf16 : {false, true}) {
    auto w = shape(2, 150, 4, 2, 64);
    w.sliding_window = 40;  // not a multiple of the 32-key tile
    check_attention("window 40", w, Docs::kNone, bf16);
    auto c = shape(1, 90, 2, 1, 256);  // Gemma2's head_dim
    c.softcap = 2.0f;  // small enough that the cap bends typical scores
    c.sliding_window = 64;
    check_attention("softcap 2 + window 64, D256", c, Docs::kNone, bf16);
  }
}

KTUNE_CUDA_TEST(AttentionDocumentIdsMaskAcrossPackedSamples) {
  for (bool bf16 : {false, true}) {
    check_attention("doc ids", shape(2, 97, 4, 2, 64), Docs::kThree, bf16);
    check_attention("packed docs with padding", shape(3, 75, 4, 1, 48), Docs::kPacked, bf16);
    check_attention("short docs gqa 2:1", shape(3, 110, 2, 1, 32), Docs::kShort, bf16);
    auto w = shape(3, 110, 2, 1, 48);
    w.sliding_window = 40;  // the window's range and the documents' intersect
    check_attention("short docs + window 40", w, Docs::kShort, bf16);
  }
}

// Masked as one document a row but given the bounds of a split into documents at multiples of 32
// tokens (this kernel's key and query tiles; its blocks of 8 rows never straddle a split), the kernel
// must give the split's results bit for bit: under the one-document mask the keys before a split
// document's start are visible, so only tiles really skipped leave them out (forward and dq), and
// likewise the queries after its end (dk, dv).
KTUNE_CUDA_TEST(AttentionSkipsTilesByDocumentBounds) {
  const auto s = shape(2, 100, 2, 1, 48);
  std::vector<int32_t> one(size_t(s.B * s.T), 3), split;
  for (int64_t i = 0; i < s.T; ++i) split.push_back(i < 32 ? 0 : i < 96 ? 1 : 2);
  for (int64_t i = 0; i < s.T; ++i) split.push_back(i < 64 ? 0 : 1);
  const auto d_one = to_device(one), d_split = to_device(split);
  const auto split_bounds = cuda_test::device_document_bounds(split, s.B, s.T);
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  for (bool bf16 : {false, true}) {
    TiledInputs in{random_floats(nq, 11), random_floats(nkv, 12), random_floats(nkv, 13), random_floats(nq, 14)};
    if (bf16) in = {rounded_to_bf16(in.q), rounded_to_bf16(in.k), rounded_to_bf16(in.v), rounded_to_bf16(in.dout)};
    const std::string what = bf16 ? "bf16" : "f32";
    const TiledResults want = run_tiled(in, d_split.as<int32_t>(), {}, s, bf16);
    check_identical(run_tiled(in, d_one.as<int32_t>(), split_bounds.view(), s, bf16), want,
                    what + " one document bounded as the split");
    // The split must matter, or the check above proves nothing.
    const TiledResults one_doc = run_tiled(in, d_one.as<int32_t>(), {}, s, bf16);
    CHECK(one_doc.out != want.out && one_doc.dk != want.dk) << what << ": the split changes nothing";
  }
}

KTUNE_CUDA_TEST(AttentionRejectsHeadsThatDoNotGroup) {
  auto s = shape(1, 8, 3, 2, 32);
  cuda::DeviceBuffer buf(4096);
  bool threw = false;
  try {
    cuda::attention_forward(buf.as<float>(), buf.as<float>(), buf.as<float>(), buf.as<float>(), buf.as<float>(),
                            nullptr, s);
  } catch (const Error&) {
    threw = true;
  }
  CHECK(threw) << "Hq=3, Hkv=2 must be refused";
}

}  // namespace
}  // namespace ktune
