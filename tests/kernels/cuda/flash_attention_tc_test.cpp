// The fused tensor-core attention (kernels/cuda/flash_attention_tc.h) against the CPU reference (full
// (T, T) scores per head in double, src/kernels/cpu/attention_reference.cpp) and against the tiled
// CUDA-core kernel (kernels/cuda/attention.h) on the same bf16 inputs: GQA 4:1, 2:1 and 1:1, head_dim
// 64 and 128, B > 1, rows that are and are not multiples of the 64-query / 64- or 128-key tiles, one
// row, and peaked softmaxes (large scores: the online rescaling matters); and packed rows (document
// ids: a one-token document, documents whose boundary differs by row, a padding document whose rows
// see no key of the first tiles). Each forward's (out, lse) also goes through the other kernel's
// backward (the lse convention is shared).
// Tolerances. out: P is rounded to bf16 before P V (relative 2^-9 a probability), so
// |out - ref| <= 2^-9 max|v| (= 1.95e-3 here, v in [-1, 1]) plus the output's own rounding: atol 2e-3,
// rtol 1e-2 (the first rows, with one or two keys, come close to that bound: 1e-3 was too tight).
// lse is f32 throughout: 2e-5, 1e-5. Gradients: dS is rounded to bf16 before dS K and dSᵀ Q, and
// delta = rowsum(dout * out) uses the bf16 out (as the tiled kernel does, which is off by as much),
// summed over up to T queries: atol 6e-3, rtol 1e-2 as the GEMM path's test (attention_gemm_test.cpp),
// times q_scale for the peaked cases (dk = sum_i dS_ij q_i grows with |q|), and times sqrt(G / 4) for
// G query heads a key head beyond 4 (dk and dv sum the rounding of G heads: an 8:1 group reached 1.14x
// the unscaled bound on dv in the host emulation, exactly as a CPU emulation rounding P to bf16
// does, while 4:1 reached 0.68x). A wrong mask, a missed
// tile or a wrong softmax is off by 0.1 or more. Against the tiled kernel, whose bf16 results are
// within attention_test.cpp's bounds of the reference (out 1e-5 + 1e-2, gradients 4e-3 + 1e-2): the
// sum of both kernels' bounds. A backward fed the other kernel's forward is held to the fused bound.
// These margins were checked by running this file's shapes and steps through a host emulation of both
// kernels (a fiber a thread, wmma with scrambled fragment layouts, exact exp): worst error / bound was
// out 0.60, lse 0.01, dq 0.23, dk 0.35, dv 0.68 against the CPU; 0.56 and 0.40 (out, dv) tc vs tiled.
#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention_tc.h"

namespace ktune {
namespace {

using namespace cuda_test;  // random_floats, rounded_to_bf16, to_bf16, from_bf16, to_device, from_device

struct Tolerance {
  double out_atol, out_rtol, lse_atol, lse_rtol, grad_atol, grad_rtol;
};
constexpr Tolerance kAgainstCpu{2e-3, 1e-2, 2e-5, 1e-5, 6e-3, 1e-2};
constexpr Tolerance kAgainstTiled{2e-3 + 1e-5, 2e-2, 4e-5, 2e-5, 6e-3 + 4e-3, 2e-2};

// The gradient bounds of t widened for q in [-q_scale, q_scale) and for `group` query heads a key head.
Tolerance widened(Tolerance t, float q_scale, int64_t group) {
  t.grad_atol *= std::max(1.0, double(q_scale)) * std::sqrt(std::max(1.0, double(group) / 4.0));
  return t;
}

// One attention's results, downloaded as floats.
struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

// Device copies of the inputs and room for a forward and a backward.
struct DeviceAttention {
  cuda::DeviceBuffer q, k, v, dout, out, lse, dq, dk, dv, scratch;
};

void check_forward(const Results& got, const Results& want, const Tolerance& t, const std::string& what) {
  CHECK_CLOSE(got.out.data(), want.out.data(), int64_t(want.out.size()), t.out_atol, t.out_rtol) << what << " out";
  CHECK_CLOSE(got.lse.data(), want.lse.data(), int64_t(want.lse.size()), t.lse_atol, t.lse_rtol) << what << " lse";
}

void check_backward(const Results& got, const Results& want, const Tolerance& t, const std::string& what) {
  CHECK_CLOSE(got.dq.data(), want.dq.data(), int64_t(want.dq.size()), t.grad_atol, t.grad_rtol) << what << " dq";
  CHECK_CLOSE(got.dk.data(), want.dk.data(), int64_t(want.dk.size()), t.grad_atol, t.grad_rtol) << what << " dk";
  CHECK_CLOSE(got.dv.data(), want.dv.data(), int64_t(want.dv.size()), t.grad_atol, t.grad_rtol) << what << " dv";
}

// Per row b of a packed batch: document 0 the first token alone, 1 to T/3, 2 to T - T/8 - b, then the
// row's padding (doc id -1).
std::vector<int32_t> packed_doc_ids(int64_t B, int64_t T) {
  std::vector<int32_t> docs;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) docs.push_back(i == 0 ? 0 : i < T / 3 ? 1 : i < T - T / 8 - b ? 2 : -1);
  return docs;
}

// q scaled by q_scale (scores ~ q_scale / 3 typical): large values give peaked rows. packed: every
// kernel and the reference masked by packed_doc_ids.
void check_flash_attention_tc(const char* name, cpu::AttentionShape s, float q_scale = 1.0f, bool packed = false) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  const size_t nlse = size_t(s.B * s.Hq * s.T);
  auto q = rounded_to_bf16(random_floats(nq, 21, -q_scale, q_scale)), k = rounded_to_bf16(random_floats(nkv, 22));
  auto v = rounded_to_bf16(random_floats(nkv, 23)), dout = rounded_to_bf16(random_floats(nq, 24));

  const std::vector<int32_t> docs = packed ? packed_doc_ids(s.B, s.T) : std::vector<int32_t>();
  const int32_t* doc_ptr = packed ? docs.data() : nullptr;
  cuda::DeviceBuffer d_docs = packed ? to_device(docs) : cuda::DeviceBuffer();
  const int32_t* d_doc_ptr = packed ? d_docs.as<int32_t>() : nullptr;
  // The CPU reference; its backward's rowsum sees the bf16-rounded out, as the GPU's does.
  Results ref{std::vector<float>(nq), std::vector<float>(nlse), std::vector<float>(nq), std::vector<float>(nkv),
              std::vector<float>(nkv)};
  cpu::attention_forward_reference(ref.out.data(), ref.lse.data(), q.data(), k.data(), v.data(), doc_ptr, s);
  const auto ref_out_rounded = rounded_to_bf16(ref.out);
  cpu::attention_backward_reference(ref.dq.data(), ref.dk.data(), ref.dv.data(), dout.data(), q.data(), k.data(),
                                    v.data(), ref_out_rounded.data(), ref.lse.data(), doc_ptr, s);

  DeviceAttention d{to_device(to_bf16(q)), to_device(to_bf16(k)), to_device(to_bf16(v)), to_device(to_bf16(dout)),
                    cuda::DeviceBuffer(nq * 2), cuda::DeviceBuffer(nlse * 4), cuda::DeviceBuffer(nq * 2),
                    cuda::DeviceBuffer(nkv * 2), cuda::DeviceBuffer(nkv * 2),
                    cuda::DeviceBuffer(size_t(cuda::flash_attention_tc_backward_scratch_floats(s)) * 4)};
  cuda::DeviceBuffer tiled_scratch(size_t(cuda::attention_backward_scratch_floats(s)) * 4);
  auto download = [&] {
    return Results{from_bf16(from_device<bf16_t>(d.out, nq)), from_device<float>(d.lse, nlse),
                   from_bf16(from_device<bf16_t>(d.dq, nq)), from_bf16(from_device<bf16_t>(d.dk, nkv)),
                   from_bf16(from_device<bf16_t>(d.dv, nkv))};
  };
  auto tc_forward = [&] {
    cuda::flash_attention_tc_forward(d.out.as<bf16_t>(), d.lse.as<float>(), d.q.as<bf16_t>(), d.k.as<bf16_t>(),
                                     d.v.as<bf16_t>(), s, nullptr, d_doc_ptr);
  };
  auto tc_backward = [&] {
    cuda::flash_attention_tc_backward(d.dq.as<bf16_t>(), d.dk.as<bf16_t>(), d.dv.as<bf16_t>(), d.dout.as<bf16_t>(),
                                      d.q.as<bf16_t>(), d.k.as<bf16_t>(), d.v.as<bf16_t>(), d.out.as<bf16_t>(),
                                      d.lse.as<float>(), s, d.scratch.as<float>(), nullptr, d_doc_ptr);
  };
  auto tiled_forward = [&] {
    cuda::attention_forward(d.out.as<bf16_t>(), d.lse.as<float>(), d.q.as<bf16_t>(), d.k.as<bf16_t>(),
                            d.v.as<bf16_t>(), d_doc_ptr, s);
  };
  auto tiled_backward = [&] {
    cuda::attention_backward(d.dq.as<bf16_t>(), d.dk.as<bf16_t>(), d.dv.as<bf16_t>(), d.dout.as<bf16_t>(),
                             d.q.as<bf16_t>(), d.k.as<bf16_t>(), d.v.as<bf16_t>(), d.out.as<bf16_t>(),
                             d.lse.as<float>(), d_doc_ptr, s, tiled_scratch.as<float>());
  };
  const std::string what = name;
  const int64_t group = s.Hq / s.Hkv;
  const Tolerance against_cpu = widened(kAgainstCpu, q_scale, group), against_tiled = widened(kAgainstTiled, q_scale, group);

  // 1. The fused kernel alone, forward then backward, against the CPU reference.
  tc_forward();
  tc_backward();
  const Results tc = download();
  check_forward(tc, ref, against_cpu, what + " tc vs cpu");
  check_backward(tc, ref, against_cpu, what + " tc vs cpu");

  // 2. The tiled kernel, forward then backward, against the fused one.
  tiled_forward();
  tiled_backward();
  const Results tiled = download();
  check_forward(tc, tiled, against_tiled, what + " tc vs tiled");
  check_backward(tc, tiled, against_tiled, what + " tc vs tiled");

  // 3. The fused backward from the tiled forward's (out, lse) still in place.
  tc_backward();
  check_backward(download(), ref, against_cpu, what + " tc backward after tiled forward vs cpu");

  // 4. The tiled backward from the fused forward's (out, lse).
  tc_forward();
  tiled_backward();
  check_backward(download(), ref, against_cpu, what + " tiled backward after tc forward vs cpu");
}

cpu::AttentionShape shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  return cpu::AttentionShape{B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D)))};
}

KTUNE_CUDA_TEST(FlashAttentionTcHeadDim64MatchesReferences) {
  check_flash_attention_tc("D64 gqa 4:1 B2 T200", shape(2, 200, 8, 2, 64));   // 200 = 3 tiles + 8
  check_flash_attention_tc("D64 mha 1:1 T64", shape(1, 64, 2, 2, 64));        // exactly one tile
  check_flash_attention_tc("D64 gqa 2:1 B3 T129", shape(3, 129, 4, 2, 64));   // one row past two tiles
  check_flash_attention_tc("D64 one row", shape(2, 1, 4, 1, 64));
}

KTUNE_CUDA_TEST(FlashAttentionTcHeadDim128MatchesReferences) {
  check_flash_attention_tc("D128 mha 1:1 B2 T130", shape(2, 130, 2, 2, 128));  // key tiles of 128: one + 2
  check_flash_attention_tc("D128 gqa 4:1 T77", shape(1, 77, 4, 1, 128));
  check_flash_attention_tc("D128 gqa 4:1 B2 T256", shape(2, 256, 8, 2, 128));   // whole tiles, several
  check_flash_attention_tc("D128 gqa 8:1 T80", shape(1, 80, 8, 1, 128));         // a Llama-3-70B-like group
}

KTUNE_CUDA_TEST(FlashAttentionTcPeakedSoftmaxMatchesReferences) {
  // q in [-6, 6): scores spread over ~ +-5, so later key tiles raise the running max often.
  check_flash_attention_tc("D64 peaked gqa 4:1 T300", shape(1, 300, 4, 1, 64), 6.0f);
  check_flash_attention_tc("D128 peaked 1:1 T190", shape(1, 190, 2, 2, 128), 6.0f);
}

// Packed rows: documents end inside and at the edges of tiles; the padding rows (from T - T/8 - b)
// see no key of the tiles before theirs, so their first tiles are wholly masked.
KTUNE_CUDA_TEST(FlashAttentionTcDocumentIdsMatchReferences) {
  check_flash_attention_tc("D64 packed gqa 2:1 B2 T140", shape(2, 140, 4, 2, 64), 1.0f, true);
  check_flash_attention_tc("D128 packed gqa 2:1 T150", shape(1, 150, 2, 1, 128), 1.0f, true);
}

// The op refuses what it does not take, naming itself.
void check_refused(cpu::AttentionShape s, const char* why) {
  cuda::DeviceBuffer buf(1 << 16);
  std::string message;
  try {
    cuda::flash_attention_tc_forward(buf.as<bf16_t>(), buf.as<float>(), buf.as<bf16_t>(), buf.as<bf16_t>(),
                                     buf.as<bf16_t>(), s);
  } catch (const Error& e) {
    message = e.what();
  }
  CHECK(message.find("flash_attention_tc") != std::string::npos) << why << " must be refused by name, got '"
                                                                  << message << "'";
  CHECK(!cuda::flash_attention_tc_supports(s)) << why << " must not be reported as supported";
}

KTUNE_CUDA_TEST(FlashAttentionTcRefusesWhatItDoesNotTake) {
  check_refused(shape(1, 8, 2, 1, 96), "head_dim 96");
  check_refused(shape(1, 8, 2, 1, 256), "head_dim 256");
  check_refused(shape(1, 8, 3, 2, 64), "Hq=3, Hkv=2");
  auto w = shape(1, 8, 2, 1, 64);
  w.sliding_window = 4;
  check_refused(w, "a sliding window");
  auto c = shape(1, 8, 2, 1, 64);
  c.softcap = 2.0f;
  check_refused(c, "a soft-cap");
  CHECK(cuda::flash_attention_tc_supports(shape(1, 8, 4, 1, 64))) << "D64 GQA is supported";
  CHECK(cuda::flash_attention_tc_supports(shape(1, 8, 2, 2, 128))) << "D128 MHA is supported";
}

}  // namespace
}  // namespace ktune
