// Tiled attention on the GPU against the CPU reference (full (T, T) scores per head in double,
// src/kernels/cpu/attention_reference.cpp) on the same inputs: causal, GQA, sliding window,
// soft-cap, document ids, head dims that are and are not multiples of 32, several tiles and blocks.
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

namespace ktune {
namespace {

using cuda_test::from_bf16;
using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::rounded_to_bf16;
using cuda_test::to_bf16;
using cuda_test::to_device;

// Document layouts: kThree, three documents a row of uneven lengths; kPacked, a packed batch's:
// document 0 the first token alone, 1 to T/3, 2 to T - T/8 - b, then the row's padding (doc id -1).
enum class Docs { kNone, kThree, kPacked };

std::vector<int32_t> doc_ids(Docs docs, int64_t B, int64_t T) {
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
  cuda::DeviceBuffer d_lse(lse.size() * 4), scratch(size_t(cuda::attention_backward_scratch_floats(s)) * 4);
  std::vector<float> got_out, got_dq, got_dk, got_dv;
  if (!bf16) {
    auto d_q = to_device(q), d_k = to_device(k), d_v = to_device(v), d_dout = to_device(dout);
    cuda::DeviceBuffer d_out(nq * 4), d_dq(nq * 4), d_dk(nkv * 4), d_dv(nkv * 4);
    cuda::attention_forward(d_out.as<float>(), d_lse.as<float>(), d_q.as<float>(), d_k.as<float>(), d_v.as<float>(),
                            d_doc_ptr, s);
    cuda::attention_backward(d_dq.as<float>(), d_dk.as<float>(), d_dv.as<float>(), d_dout.as<float>(),
                             d_q.as<float>(), d_k.as<float>(), d_v.as<float>(), d_out.as<float>(), d_lse.as<float>(),
                             d_doc_ptr, s, scratch.as<float>());
    got_out = from_device<float>(d_out, nq), got_dq = from_device<float>(d_dq, nq);
    got_dk = from_device<float>(d_dk, nkv), got_dv = from_device<float>(d_dv, nkv);
  } else {
    auto d_q = to_device(to_bf16(q)), d_k = to_device(to_bf16(k)), d_v = to_device(to_bf16(v));
    auto d_dout = to_device(to_bf16(dout));
    cuda::DeviceBuffer d_out(nq * 2), d_dq(nq * 2), d_dk(nkv * 2), d_dv(nkv * 2);
    cuda::attention_forward(d_out.as<bf16_t>(), d_lse.as<float>(), d_q.as<bf16_t>(), d_k.as<bf16_t>(),
                            d_v.as<bf16_t>(), d_doc_ptr, s);
    cuda::attention_backward(d_dq.as<bf16_t>(), d_dk.as<bf16_t>(), d_dv.as<bf16_t>(), d_dout.as<bf16_t>(),
                             d_q.as<bf16_t>(), d_k.as<bf16_t>(), d_v.as<bf16_t>(), d_out.as<bf16_t>(),
                             d_lse.as<float>(), d_doc_ptr, s, scratch.as<float>());
    got_out = from_bf16(from_device<bf16_t>(d_out, nq)), got_dq = from_bf16(from_device<bf16_t>(d_dq, nq));
    got_dk = from_bf16(from_device<bf16_t>(d_dk, nkv)), got_dv = from_bf16(from_device<bf16_t>(d_dv, nkv));
  }
  auto got_lse = from_device<float>(d_lse, lse.size());
  const double out_atol = bf16 ? 1e-5 : 2e-5, out_rtol = bf16 ? 1e-2 : 1e-4;
  const double grad_atol = bf16 ? 4e-3 : 2e-5, grad_rtol = bf16 ? 1e-2 : 1e-4;
  const char* type = bf16 ? " bf16" : " f32";
  CHECK_CLOSE(got_out.data(), out.data(), int64_t(nq), out_atol, out_rtol) << name << type;
  CHECK_CLOSE(got_lse.data(), lse.data(), int64_t(lse.size()), 2e-5, 1e-5) << name << type;
  CHECK_CLOSE(got_dq.data(), dq.data(), int64_t(nq), grad_atol, grad_rtol) << name << type;
  CHECK_CLOSE(got_dk.data(), dk.data(), int64_t(nkv), grad_atol, grad_rtol) << name << type;
  CHECK_CLOSE(got_dv.data(), dv.data(), int64_t(nkv), grad_atol, grad_rtol) << name << type;
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
