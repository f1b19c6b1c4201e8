// The tensor-core attention path (kernels/cuda/attention_gemm.h: cuBLASLt GEMMs over one head's
// scores at a time) against the CPU reference (full (T, T) scores in double) on the same bf16
// inputs: causal, GQA and MQA groups, head dims 48/64/128, rows that are not tile multiples.
// Tolerances: as the tiled kernel's bf16 test (attention_test.cpp), plus P rounded to bf16 before
// the P V and P^T dO products (relative 2^-9 per probability): over many keys the errors' random
// signs leave ~1e-4, but a row with one or two keys holds P near 1, so |out - ref| reaches
// 2^-9 max|v| = 1.95e-3 (v in [-1, 1]); out gets atol 2e-3 (1e-3 failed at 1.14-1.46x in the host
// emulator, tests/kernels/cuda/emulator, whose products round P exactly so), as flash_attention_tc's; dq, dk, dv
// also see dS rounded to bf16 (relative 2^-9): atol 6e-3. A wrong mask or softmax is off by 0.1+.
// Document ids (packed rows) are checked the same way: a one-token document, two longer ones whose
// boundary differs between rows, and a padding document (-1) at the end of each row.
// Sliding windows and soft-caps (Mistral, Gemma2) against the same reference: windows shorter than T
// that divide nothing, w = 1 (each query sees only itself), w = T - 1; Gemma2's cap of 50 (nearly
// linear at these scores: only lse tells it from no cap) and a cap of 2 at scale 1/2, where tanh
// saturates (|s| reaches ~7; without the cap out is off by 0.6, without its derivative dq by 0.6);
// both together, with GQA and doc ids. Scale 1/2 rather than 1: the backward's delta = rowsum(dO O)
// reads the bf16 O, whose error reaches dq and dk times the scale (at scale 1 they miss 6e-3 by 1.3-1.9x).
#include <cmath>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_gemm.h"

namespace ktune {
namespace {

using cuda_test::from_bf16;
using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::rounded_to_bf16;
using cuda_test::to_bf16;
using cuda_test::to_device;

// Per row: document 0 is the first token alone, 1 runs to T/3, 2 to T - T/8 - b, then padding (-1).
std::vector<int32_t> packed_doc_ids(int64_t B, int64_t T) {
  std::vector<int32_t> docs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) docs.push_back(i == 0 ? 0 : i < T / 3 ? 1 : i < T - T / 8 - b ? 2 : -1);
  return docs;
}

void check_gemm_attention(const char* name, cpu::AttentionShape s, bool with_docs = false) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  auto q = rounded_to_bf16(random_floats(nq, 11)), k = rounded_to_bf16(random_floats(nkv, 12));
  auto v = rounded_to_bf16(random_floats(nkv, 13)), dout = rounded_to_bf16(random_floats(nq, 14));
  const std::vector<int32_t> docs = with_docs ? packed_doc_ids(s.B, s.T) : std::vector<int32_t>();
  const int32_t* doc_ptr = with_docs ? docs.data() : nullptr;
  std::vector<float> out(nq), lse(size_t(s.B * s.Hq * s.T)), dq(nq), dk(nkv), dv(nkv);
  cpu::attention_forward_reference(out.data(), lse.data(), q.data(), k.data(), v.data(), doc_ptr, s);
  // The backward's rowsum uses the bf16-rounded forward output, as the GPU's does.
  const auto out_rounded = rounded_to_bf16(out);
  cpu::attention_backward_reference(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                    out_rounded.data(), lse.data(), doc_ptr, s);

  cuda::GemmContext ctx;
  cuda::DeviceBuffer d_docs = with_docs ? to_device(docs) : cuda::DeviceBuffer();
  const int32_t* d_doc_ptr = with_docs ? d_docs.as<int32_t>() : nullptr;
  auto d_q = to_device(to_bf16(q)), d_k = to_device(to_bf16(k)), d_v = to_device(to_bf16(v));
  auto d_dout = to_device(to_bf16(dout));
  cuda::DeviceBuffer d_out(nq * 2), d_dq(nq * 2), d_dk(nkv * 2), d_dv(nkv * 2), d_lse(lse.size() * 4);
  cuda::DeviceBuffer scratch(cuda::attention_gemm_scratch_bytes(s));
  cuda::attention_gemm_forward(ctx, d_out.as<bf16_t>(), d_lse.as<float>(), d_q.as<bf16_t>(), d_k.as<bf16_t>(),
                               d_v.as<bf16_t>(), s, scratch.data(), nullptr, d_doc_ptr);
  cuda::attention_gemm_backward(ctx, d_dq.as<bf16_t>(), d_dk.as<bf16_t>(), d_dv.as<bf16_t>(), d_dout.as<bf16_t>(),
                                d_q.as<bf16_t>(), d_k.as<bf16_t>(), d_v.as<bf16_t>(), d_out.as<bf16_t>(),
                                d_lse.as<float>(), s, scratch.data(), nullptr, d_doc_ptr);
  auto got_out = from_bf16(from_device<bf16_t>(d_out, nq)), got_dq = from_bf16(from_device<bf16_t>(d_dq, nq));
  auto got_dk = from_bf16(from_device<bf16_t>(d_dk, nkv)), got_dv = from_bf16(from_device<bf16_t>(d_dv, nkv));
  auto got_lse = from_device<float>(d_lse, lse.size());
  CHECK_CLOSE(got_out.data(), out.data(), int64_t(nq), 2e-3, 1e-2) << name;
  CHECK_CLOSE(got_lse.data(), lse.data(), int64_t(lse.size()), 2e-5, 1e-5) << name;
  CHECK_CLOSE(got_dq.data(), dq.data(), int64_t(nq), 6e-3, 1e-2) << name;
  CHECK_CLOSE(got_dk.data(), dk.data(), int64_t(nkv), 6e-3, 1e-2) << name;
  CHECK_CLOSE(got_dv.data(), dv.data(), int64_t(nkv), 6e-3, 1e-2) << name;
}

cpu::AttentionShape shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  return cpu::AttentionShape{B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D)))};
}

KTUNE_CUDA_TEST(AttentionGemmCausalGqaMatchesCpuReference) {
  check_gemm_attention("gemm causal gqa 4:2 D64", shape(2, 77, 4, 2, 64));
  check_gemm_attention("gemm causal mqa 4:1 D48", shape(1, 100, 4, 1, 48));
  check_gemm_attention("gemm causal mha D128", shape(3, 64, 2, 2, 128));
}

KTUNE_CUDA_TEST(AttentionGemmDocumentIdsMaskAcrossPackedSamples) {
  check_gemm_attention("gemm doc ids gqa 4:2 D64", shape(2, 83, 4, 2, 64), true);
  check_gemm_attention("gemm doc ids mqa 4:1 D48", shape(3, 40, 4, 1, 48), true);
}

// s with key j visible to query i only when i - window < j (kernels/cpu/attention.h's window).
cpu::AttentionShape windowed(cpu::AttentionShape s, int64_t window) {
  s.sliding_window = window;
  return s;
}

// s with the scores capped at softcap tanh(s / softcap), at the given scale.
cpu::AttentionShape softcapped(cpu::AttentionShape s, float softcap, float scale) {
  s.softcap = softcap;
  s.scale = scale;
  return s;
}

KTUNE_CUDA_TEST(AttentionGemmSlidingWindowMatchesCpuReference) {
  check_gemm_attention("gemm window 16 gqa 4:2 D64", windowed(shape(2, 77, 4, 2, 64), 16));
  check_gemm_attention("gemm window 7 mqa 4:1 D48", windowed(shape(3, 50, 4, 1, 48), 7));
  check_gemm_attention("gemm window 1 gqa 2:1 D64", windowed(shape(2, 33, 2, 1, 64), 1));
  check_gemm_attention("gemm window = T - 1 mha D128", windowed(shape(2, 40, 2, 2, 128), 39));
}

KTUNE_CUDA_TEST(AttentionGemmSoftcapMatchesCpuReference) {
  check_gemm_attention("gemm softcap 50 gqa 4:2 D64", softcapped(shape(2, 64, 4, 2, 64), 50.0f, 0.125f));
  check_gemm_attention("gemm softcap 50 scale 1/16 mqa 4:1 D48", softcapped(shape(2, 45, 4, 1, 48), 50.0f, 0.0625f));
  check_gemm_attention("gemm softcap 2 scale 1/2 gqa 4:2 D64", softcapped(shape(2, 70, 4, 2, 64), 2.0f, 0.5f));
}

KTUNE_CUDA_TEST(AttentionGemmWindowAndSoftcapTogether) {
  check_gemm_attention("gemm window 13 softcap 2 gqa 4:2 D64",
                       windowed(softcapped(shape(2, 61, 4, 2, 64), 2.0f, 0.5f), 13));
  check_gemm_attention("gemm window 19 softcap 2 docs gqa 4:2 D64",
                       windowed(softcapped(shape(2, 83, 4, 2, 64), 2.0f, 0.5f), 19), true);
  check_gemm_attention("gemm window 1 softcap 50 docs mqa 4:1 D48",
                       windowed(softcapped(shape(3, 40, 4, 1, 48), 50.0f, 0.25f), 1), true);
  check_gemm_attention("gemm window 5 docs gqa 4:2 D64", windowed(shape(2, 47, 4, 2, 64), 5), true);
}

// What the path still refuses: heads that do not group, a negative window or soft-cap.
KTUNE_CUDA_TEST(AttentionGemmRefusesUngroupedHeadsAndNegativeWindow) {
  auto refused = [](const cpu::AttentionShape& s) {
    cuda::GemmContext ctx;
    cuda::DeviceBuffer buf(4096);
    try {
      cuda::attention_gemm_forward(ctx, buf.as<bf16_t>(), buf.as<float>(), buf.as<bf16_t>(), buf.as<bf16_t>(),
                                   buf.as<bf16_t>(), s, buf.data());
    } catch (const Error&) {
      return true;
    }
    return false;
  };
  CHECK(refused(shape(1, 8, 3, 2, 32))) << "Hq = 3 over Hkv = 2 must be refused";
  CHECK(refused(windowed(shape(1, 8, 2, 1, 32), -1))) << "a negative window must be refused";
  CHECK(refused(softcapped(shape(1, 8, 2, 1, 32), -1.0f, 1.0f))) << "a negative soft-cap must be refused";
}

}  // namespace
}  // namespace ktune
