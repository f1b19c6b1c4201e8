// The fused tensor-core attention (kernels/cuda/flash_attention_tc.h) against the CPU reference (full
// (T, T) scores per head in double, src/kernels/cpu/attention_reference.cpp) and against the tiled
// CUDA-core kernel (kernels/cuda/attention.h) on the same bf16 inputs: GQA 4:1, 2:1 and 1:1, head_dim
// 64 and 128, B > 1, rows that are and are not multiples of the 64-query / 64- or 128-key tiles, one
// row, and peaked softmaxes (large scores: the online rescaling matters); and packed rows (document
// ids: a one-token document, documents whose boundary differs by row, a padding document whose rows
// see no key of the first tiles); sliding windows (of 1 key, off the tiles, longer than a tile) and
// soft-caps (50, and a saturating 2), alone and together with document ids. Each forward's (out, lse)
// also goes through the other kernel's backward (the lse convention is shared). With document ids both
// kernels run with DocumentBounds
// (skipping the tiles wholly in other documents) in those four steps, and again without them: the
// same bits (dq up to the order of the fused kernel's atomics: one bf16 ulp). Two cases show the fused
// kernel's tiles are really skipped: NaN in the rows of documents that a block's skipped tiles hold
// stays out of that block's results (a masked but computed tile passes it on: P = 0 times NaN; the
// same for the tiles a window leaves out), and a row masked as one document but bounded as several
// gives the several's results.
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
#include <limits>
#include <string>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention_tc.h"
#include "packed_documents.h"

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

Results download_results(const DeviceAttention& d, const cpu::AttentionShape& s) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  const size_t nlse = size_t(s.B * s.Hq * s.T);
  return Results{from_bf16(from_device<bf16_t>(d.out, nq)), from_device<float>(d.lse, nlse),
                 from_bf16(from_device<bf16_t>(d.dq, nq)), from_bf16(from_device<bf16_t>(d.dk, nkv)),
                 from_bf16(from_device<bf16_t>(d.dv, nkv))};
}

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

// Random bf16 inputs in d (q, k, v, dout) with room for the results.
DeviceAttention device_attention(const cpu::AttentionShape& s) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  return DeviceAttention{to_device(to_bf16(random_floats(nq, 31))), to_device(to_bf16(random_floats(nkv, 32))),
                         to_device(to_bf16(random_floats(nkv, 33))), to_device(to_bf16(random_floats(nq, 34))),
                         cuda::DeviceBuffer(nq * 2), cuda::DeviceBuffer(size_t(s.B * s.Hq * s.T) * 4),
                         cuda::DeviceBuffer(nq * 2), cuda::DeviceBuffer(nkv * 2), cuda::DeviceBuffer(nkv * 2),
                         cuda::DeviceBuffer(size_t(cuda::flash_attention_tc_backward_scratch_floats(s)) * 4)};
}

void tc_forward(DeviceAttention& d, const cpu::AttentionShape& s, const int32_t* d_docs, cuda::DocumentBounds bounds) {
  cuda::flash_attention_tc_forward(d.out.as<bf16_t>(), d.lse.as<float>(), d.q.as<bf16_t>(), d.k.as<bf16_t>(),
                                   d.v.as<bf16_t>(), s, nullptr, d_docs, bounds);
}
void tc_backward(DeviceAttention& d, const cpu::AttentionShape& s, const int32_t* d_docs, cuda::DocumentBounds bounds) {
  cuda::flash_attention_tc_backward(d.dq.as<bf16_t>(), d.dk.as<bf16_t>(), d.dv.as<bf16_t>(), d.dout.as<bf16_t>(),
                                    d.q.as<bf16_t>(), d.k.as<bf16_t>(), d.v.as<bf16_t>(), d.out.as<bf16_t>(),
                                    d.lse.as<float>(), s, d.scratch.as<float>(), nullptr, d_docs, bounds);
}

// dq of the fused kernel summed in another order (its f32 atomics): at most one bf16 ulp apart.
void check_dq_reordered(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  CHECK_CLOSE(got.data(), want.data(), int64_t(want.size()), 1e-6, 1.0 / 128) << what << " dq";
}

// got and want the same bits; dq too unless it comes from the fused kernel (`dq_reordered`: its f32
// atomics add in another order from run to run).
void check_same_results(const Results& got, const Results& want, bool dq_reordered, const std::string& what) {
  check_identical(got.out, want.out, what + " out");
  check_identical(got.lse, want.lse, what + " lse");
  if (dq_reordered) check_dq_reordered(got.dq, want.dq, what);
  else check_identical(got.dq, want.dq, what + " dq");
  check_identical(got.dk, want.dk, what + " dk");
  check_identical(got.dv, want.dv, what + " dv");
}

// q scaled by q_scale (scores ~ q_scale / 3 typical): large values give peaked rows. docs (B, T): every
// kernel and the reference masked by them (none when empty), the kernels bounded by their DocumentBounds.
void check_flash_attention_tc(const char* name, cpu::AttentionShape s, float q_scale = 1.0f,
                              const std::vector<int32_t>& docs = {}) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  const size_t nlse = size_t(s.B * s.Hq * s.T);
  auto q = rounded_to_bf16(random_floats(nq, 21, -q_scale, q_scale)), k = rounded_to_bf16(random_floats(nkv, 22));
  auto v = rounded_to_bf16(random_floats(nkv, 23)), dout = rounded_to_bf16(random_floats(nq, 24));

  const bool packed = !docs.empty();
  const int32_t* doc_ptr = packed ? docs.data() : nullptr;
  cuda::DeviceBuffer d_docs = packed ? to_device(docs) : cuda::DeviceBuffer();
  const int32_t* d_doc_ptr = packed ? d_docs.as<int32_t>() : nullptr;
  const auto d_bounds = packed ? device_document_bounds(docs, s.B, s.T) : DeviceDocumentBounds();
  const cuda::DocumentBounds bounds = packed ? d_bounds.view() : cuda::DocumentBounds{};
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
  auto download = [&] { return download_results(d, s); };
  auto tiled_forward = [&](cuda::DocumentBounds with) {
    cuda::attention_forward(d.out.as<bf16_t>(), d.lse.as<float>(), d.q.as<bf16_t>(), d.k.as<bf16_t>(),
                            d.v.as<bf16_t>(), d_doc_ptr, with, s);
  };
  auto tiled_backward = [&](cuda::DocumentBounds with) {
    cuda::attention_backward(d.dq.as<bf16_t>(), d.dk.as<bf16_t>(), d.dv.as<bf16_t>(), d.dout.as<bf16_t>(),
                             d.q.as<bf16_t>(), d.k.as<bf16_t>(), d.v.as<bf16_t>(), d.out.as<bf16_t>(),
                             d.lse.as<float>(), d_doc_ptr, with, s, tiled_scratch.as<float>());
  };
  const std::string what = name;
  const int64_t group = s.Hq / s.Hkv;
  const Tolerance against_cpu = widened(kAgainstCpu, q_scale, group), against_tiled = widened(kAgainstTiled, q_scale, group);

  // 1. The fused kernel alone, forward then backward, against the CPU reference.
  tc_forward(d, s, d_doc_ptr, bounds);
  tc_backward(d, s, d_doc_ptr, bounds);
  const Results tc = download();
  check_forward(tc, ref, against_cpu, what + " tc vs cpu");
  check_backward(tc, ref, against_cpu, what + " tc vs cpu");

  // 2. The tiled kernel, forward then backward, against the fused one.
  tiled_forward(bounds);
  tiled_backward(bounds);
  const Results tiled = download();
  check_forward(tc, tiled, against_tiled, what + " tc vs tiled");
  check_backward(tc, tiled, against_tiled, what + " tc vs tiled");

  // 3. The fused backward from the tiled forward's (out, lse) still in place.
  tc_backward(d, s, d_doc_ptr, bounds);
  check_backward(download(), ref, against_cpu, what + " tc backward after tiled forward vs cpu");

  // 4. The tiled backward from the fused forward's (out, lse).
  tc_forward(d, s, d_doc_ptr, bounds);
  tiled_backward(bounds);
  check_backward(download(), ref, against_cpu, what + " tiled backward after tc forward vs cpu");
  if (!packed) return;

  // 5. Without the bounds (every tile up to the diagonal computed, then masked): the same bits.
  tc_forward(d, s, d_doc_ptr, {});
  tc_backward(d, s, d_doc_ptr, {});
  check_same_results(download(), tc, true, what + " tc without bounds");
  tiled_forward({});
  tiled_backward({});
  check_same_results(download(), tiled, false, what + " tiled without bounds");
}

cpu::AttentionShape shape(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D) {
  return cpu::AttentionShape{B, T, Hq, Hkv, D, float(1.0 / std::sqrt(double(D)))};
}

// s with a sliding window (0: none) and a soft-cap (0: none).
cpu::AttentionShape masked(cpu::AttentionShape s, int64_t window, float softcap) {
  s.sliding_window = window;
  s.softcap = softcap;
  return s;
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

// Every warp's rows valid in blocks that walk three or more key tiles (forward) or (head, query tile)
// pairs (backward), so that the two shared-memory stages are each refilled while the block runs: a
// refill before every warp is done with a stage shows here (the emulator lands cp.async copies as
// early as it may under some schedules), where the shorter cases' last tiles hold rows past T only.
KTUNE_CUDA_TEST(FlashAttentionTcRefillsItsStagesSafely) {
  check_flash_attention_tc("D64 gqa 2:1 T192", shape(1, 192, 2, 1, 64));
  check_flash_attention_tc("D128 gqa 2:1 T256", shape(1, 256, 2, 1, 128));
}

// Packed rows: documents end inside and at the edges of tiles; the padding rows (from T - T/8 - b)
// see no key of the tiles before theirs, so their first tiles are wholly masked.
KTUNE_CUDA_TEST(FlashAttentionTcDocumentIdsMatchReferences) {
  check_flash_attention_tc("D64 packed gqa 2:1 B2 T140", shape(2, 140, 4, 2, 64), 1.0f, packed_doc_ids(2, 140));
  check_flash_attention_tc("D128 packed gqa 2:1 T150", shape(1, 150, 2, 1, 128), 1.0f, packed_doc_ids(1, 150));
}

// Sliding windows shorter than T: of one key (each row sees itself only), of 37 and 100 keys (off the
// 64-tiles; 100 spans two or three key tiles), and of 64; the forward then starts past the first key
// tiles of the later query blocks, the backward stops before the last query tiles of the early key blocks.
KTUNE_CUDA_TEST(FlashAttentionTcSlidingWindowsMatchReferences) {
  check_flash_attention_tc("D64 window 100 gqa 2:1 B2 T200", masked(shape(2, 200, 4, 2, 64), 100, 0.0f));
  check_flash_attention_tc("D64 window 1 T130", masked(shape(1, 130, 2, 1, 64), 1, 0.0f));
  check_flash_attention_tc("D128 window 37 gqa 2:1 B2 T150", masked(shape(2, 150, 2, 1, 128), 37, 0.0f));
  check_flash_attention_tc("D128 window 64 T160", masked(shape(1, 160, 1, 1, 128), 64, 0.0f));
}

// Soft-caps: 50 (gemma2's attention cap; scores of ~ +-5 move by ~ 0.02) and a saturating 2 (scores
// of ~ +-5 pressed to +-2: the cap's derivative 1 - t^2 nearly 0 on many entries), on peaked rows.
KTUNE_CUDA_TEST(FlashAttentionTcSoftcapsMatchReferences) {
  check_flash_attention_tc("D64 cap 50 gqa 2:1 B2 T140", masked(shape(2, 140, 4, 2, 64), 0, 50.0f), 6.0f);
  check_flash_attention_tc("D128 cap 2 gqa 2:1 T100", masked(shape(1, 100, 2, 1, 128), 0, 2.0f), 6.0f);
  check_flash_attention_tc("D64 cap 2 T70", masked(shape(1, 70, 1, 1, 64), 0, 2.0f), 6.0f);
}

// A window and a cap together, with document ids (and DocumentBounds: the forward starts at the later
// of the window's and the documents' first tile; the backward stops at the earlier end).
KTUNE_CUDA_TEST(FlashAttentionTcWindowCapAndDocumentsMatchReferences) {
  check_flash_attention_tc("D64 window 70 cap 30 short docs gqa 2:1 B3 T200",
                           masked(shape(3, 200, 2, 1, 64), 70, 30.0f), 3.0f, short_documents(3, 200));
  check_flash_attention_tc("D128 window 90 cap 2 packed gqa 2:1 B2 T160",
                           masked(shape(2, 160, 2, 1, 128), 90, 2.0f), 3.0f, packed_doc_ids(2, 160));
}

// Many short documents (short_documents: lengths off the tiles, some longer than a tile, a row of one
// document, recurring ids, padding), B = 3, GQA.
KTUNE_CUDA_TEST(FlashAttentionTcShortDocumentsMatchReferences) {
  check_flash_attention_tc("D64 short docs gqa 2:1 B3 T200", shape(3, 200, 2, 1, 64), 1.0f, short_documents(3, 200));
}

// The fused kernel's tiling, mirrored to know which tiles a block skips: forward row blocks of 64
// queries (one or two a thread block) walk key tiles of 64 each; backward blocks of 64 keys (D = 64)
// or 128 (D = 128) walk query tiles of 64.
constexpr int64_t kTcTile = 64;
int64_t tc_backward_keys(const cpu::AttentionShape& s) { return s.D == 64 ? 64 : 128; }

// The first key the forward block at q0 walks: the tile of its rows' smallest first_key, or of its
// first row's first key in the window (window > 0) if that is later.
int64_t tc_first_key(const std::vector<int32_t>& first_key, int64_t b, int64_t T, int64_t q0, int64_t window) {
  int64_t lo = q0;
  for (int64_t i = q0; i < std::min(q0 + kTcTile, T); ++i) lo = std::min(lo, int64_t(first_key[size_t(b * T + i)]));
  if (window > 0) lo = std::max(lo, std::max(int64_t(0), q0 - window + 1));
  return lo / kTcTile * kTcTile;
}
// The end of the query tiles the backward block at k0 walks: past the tile of its keys' largest
// last_query, or of the last query its last key's window reaches (window > 0) if that is earlier.
int64_t tc_query_end(const std::vector<int32_t>& last_query, int64_t b, int64_t T, int64_t k0, int64_t keys,
                     int64_t window) {
  int64_t hi = std::min(k0 + keys, T) - 1;
  for (int64_t j = k0; j < std::min(k0 + keys, T); ++j) hi = std::max(hi, int64_t(last_query[size_t(b * T + j)]));
  if (window > 0) hi = std::min(hi, k0 + keys - 1 + window - 1);
  return std::min(T, (hi / kTcTile + 1) * kTcTile);
}

// (B, T, H, D) rows [from, to) of batch row b, all heads, set to NaN (bf16) in buf (uploaded from x).
void poison_rows(cuda::DeviceBuffer& buf, std::vector<bf16_t> x, const std::vector<int64_t>& from,
                 const std::vector<int64_t>& to, int64_t T, int64_t H, int64_t D) {
  const bf16_t nan = f32_to_bf16(std::numeric_limits<float>::quiet_NaN());
  for (size_t b = 0; b < from.size(); ++b)
    for (int64_t i = from[b]; i < to[b]; ++i)
      std::fill_n(x.begin() + ((int64_t(b) * T + i) * H) * D, H * D, nan);
  buf.upload(x.data(), x.size() * sizeof(bf16_t));
}

// With DocumentBounds (and s's window), NaN in what a block's skipped tiles hold must not reach that
// block's results:
// forward: per row b, the keys (k, v) [0, P) with P the smallest nonzero first key a forward block
//   walks from; the blocks walking from P or later must give the clean run's out and lse bits;
// backward (on the clean forward): per row b, the queries (q, dout) [E, T) with E the smallest end of a
//   backward block's query tiles; the blocks ending at E or before must give the clean dk and dv bits,
//   and the queries before E the clean dq (up to its atomics' order).
// Without the skipping every checked block computes a NaN tile, masked: P = 0 and 0 * NaN = NaN.
void check_skipped_tiles_unread(const char* name, cpu::AttentionShape s, const std::vector<int32_t>& docs) {
  const int64_t B = s.B, T = s.T, keys = tc_backward_keys(s), window = s.sliding_window;
  std::vector<int32_t> first_key(docs.size()), last_query(docs.size());
  cuda::document_bounds(first_key.data(), last_query.data(), docs.data(), B, T);
  const auto d_docs = to_device(docs), d_first_key = to_device(first_key), d_last_query = to_device(last_query);
  const cuda::DocumentBounds bounds{d_first_key.as<int32_t>(), d_last_query.as<int32_t>()};
  DeviceAttention d = device_attention(s);
  const size_t nq = size_t(B * T * s.Hq * s.D), nkv = size_t(B * T * s.Hkv * s.D);
  const auto q = from_device<bf16_t>(d.q, nq), k = from_device<bf16_t>(d.k, nkv), v = from_device<bf16_t>(d.v, nkv);
  const auto dout = from_device<bf16_t>(d.dout, nq);
  tc_forward(d, s, d_docs.as<int32_t>(), bounds);
  tc_backward(d, s, d_docs.as<int32_t>(), bounds);
  const Results clean = download_results(d, s);

  std::vector<int64_t> zero(size_t(B), 0), key_end(size_t(B), 0), query_begin(size_t(B), T), end(size_t(B), T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t q0 = 0; q0 < T; q0 += kTcTile) {
      const int64_t first = tc_first_key(first_key, b, T, q0, window);
      if (first > 0 && (key_end[size_t(b)] == 0 || first < key_end[size_t(b)])) key_end[size_t(b)] = first;
    }
    for (int64_t k0 = 0; k0 < T; k0 += keys)
      query_begin[size_t(b)] = std::min(query_begin[size_t(b)], tc_query_end(last_query, b, T, k0, keys, window));
  }
  auto append = [](std::vector<float>& to, const std::vector<float>& from, size_t at, size_t n) {
    to.insert(to.end(), from.begin() + int64_t(at), from.begin() + int64_t(at + n));
  };
  // Forward: rows of the blocks that walk from key_end[b] on.
  poison_rows(d.k, k, zero, key_end, T, s.Hkv, s.D);
  poison_rows(d.v, v, zero, key_end, T, s.Hkv, s.D);
  tc_forward(d, s, d_docs.as<int32_t>(), bounds);
  const Results poisoned_forward = download_results(d, s);
  Results got, want;
  int64_t poisoned = 0, checked = 0;
  for (int64_t b = 0; b < B; ++b) {
    poisoned += key_end[size_t(b)];
    for (int64_t i = 0; i < T; ++i) {
      if (tc_first_key(first_key, b, T, i / kTcTile * kTcTile, window) < key_end[size_t(b)]) continue;
      ++checked;
      const size_t row = size_t((b * T + i) * s.Hq * s.D), n = size_t(s.Hq * s.D);
      append(got.out, poisoned_forward.out, row, n);
      append(want.out, clean.out, row, n);
      for (int64_t h = 0; h < s.Hq; ++h) {
        got.lse.push_back(poisoned_forward.lse[size_t((b * s.Hq + h) * T + i)]);
        want.lse.push_back(clean.lse[size_t((b * s.Hq + h) * T + i)]);
      }
    }
  }
  CHECK(poisoned > 0 && checked > 0) << name << ": the layout skips no forward tile";
  check_identical(got.out, want.out, std::string(name) + " forward beside NaN keys: out");
  check_identical(got.lse, want.lse, std::string(name) + " forward beside NaN keys: lse");

  // Backward: the clean forward's (out, lse) again, then q and dout poisoned from query_begin[b].
  poison_rows(d.k, k, zero, zero, T, s.Hkv, s.D);
  poison_rows(d.v, v, zero, zero, T, s.Hkv, s.D);
  tc_forward(d, s, d_docs.as<int32_t>(), bounds);
  poison_rows(d.q, q, query_begin, end, T, s.Hq, s.D);
  poison_rows(d.dout, dout, query_begin, end, T, s.Hq, s.D);
  tc_backward(d, s, d_docs.as<int32_t>(), bounds);
  const Results poisoned_backward = download_results(d, s);
  got = want = Results{};
  poisoned = checked = 0;
  for (int64_t b = 0; b < B; ++b) {
    poisoned += T - query_begin[size_t(b)];
    for (int64_t j = 0; j < T; ++j) {
      if (tc_query_end(last_query, b, T, j / keys * keys, keys, window) > query_begin[size_t(b)]) continue;
      ++checked;
      const size_t row = size_t((b * T + j) * s.Hkv * s.D), n = size_t(s.Hkv * s.D);
      append(got.dk, poisoned_backward.dk, row, n);
      append(want.dk, clean.dk, row, n);
      append(got.dv, poisoned_backward.dv, row, n);
      append(want.dv, clean.dv, row, n);
    }
    const size_t rows = size_t(b * T * s.Hq * s.D), n = size_t(query_begin[size_t(b)] * s.Hq * s.D);
    append(got.dq, poisoned_backward.dq, rows, n);
    append(want.dq, clean.dq, rows, n);
  }
  CHECK(poisoned > 0 && checked > 0) << name << ": the layout skips no backward tile";
  check_identical(got.dk, want.dk, std::string(name) + " backward beside NaN queries: dk");
  check_identical(got.dv, want.dv, std::string(name) + " backward beside NaN queries: dv");
  check_dq_reordered(got.dq, want.dq, std::string(name) + " backward beside NaN queries");
}

KTUNE_CUDA_TEST(FlashAttentionTcSkippedTilesAreNotRead) {
  check_skipped_tiles_unread("D64 short docs gqa 2:1 B3 T260", shape(3, 260, 4, 2, 64), short_documents(3, 260));
  check_skipped_tiles_unread("D128 short docs gqa 2:1 B1 T300", shape(1, 300, 2, 1, 128), short_documents(1, 300));
}

// A window skips whole tiles too: one document a row (only the window skips), and short documents
// with a window and a cap (row 1 of short_documents is one document: the window skips there).
KTUNE_CUDA_TEST(FlashAttentionTcWindowSkipsTiles) {
  const std::vector<int32_t> one_document(2 * 260, 0);
  check_skipped_tiles_unread("D64 window 70 gqa 2:1 B2 T260", masked(shape(2, 260, 4, 2, 64), 70, 0.0f), one_document);
  check_skipped_tiles_unread("D128 window 100 cap 20 T300", masked(shape(1, 300, 2, 1, 128), 100, 20.0f),
                             std::vector<int32_t>(300, 0));
  check_skipped_tiles_unread("D64 window 45 cap 50 short docs B3 T200", masked(shape(3, 200, 2, 1, 64), 45, 50.0f),
                             short_documents(3, 200));
}

// Masked as one document a row but bounded as a split into documents at multiples of 128 tokens (no
// forward block of 64 queries or backward block of 64 or 128 keys straddles a split), the fused kernel
// must give the split's results: under the one-document mask the keys before a split document's start
// are visible, so only tiles really skipped leave them out (forward, dq), and likewise the queries
// after its end (dk, dv).
void check_bounded_as_split(const char* name, cpu::AttentionShape s, const std::vector<int32_t>& split) {
  const std::vector<int32_t> one(split.size(), 3);
  const auto d_one = to_device(one), d_split = to_device(split);
  const auto split_bounds = device_document_bounds(split, s.B, s.T);
  DeviceAttention d = device_attention(s);
  tc_forward(d, s, d_split.as<int32_t>(), {});
  tc_backward(d, s, d_split.as<int32_t>(), {});
  const Results want = download_results(d, s);
  tc_forward(d, s, d_one.as<int32_t>(), split_bounds.view());
  tc_backward(d, s, d_one.as<int32_t>(), split_bounds.view());
  check_same_results(download_results(d, s), want, true, std::string(name) + " one document bounded as the split");
  tc_forward(d, s, d_one.as<int32_t>(), {});
  tc_backward(d, s, d_one.as<int32_t>(), {});
  const Results one_doc = download_results(d, s);  // the split must matter, or the checks prove nothing
  CHECK(one_doc.out != want.out && one_doc.dk != want.dk) << name << ": the split changes nothing";
}

KTUNE_CUDA_TEST(FlashAttentionTcSkipsTilesByDocumentBounds) {
  std::vector<int32_t> split;  // row 0: 128, 128, 44 tokens; row 1: 256, 44
  for (int64_t i = 0; i < 300; ++i) split.push_back(int32_t(i / 128));
  for (int64_t i = 0; i < 300; ++i) split.push_back(i < 256 ? 0 : 1);
  check_bounded_as_split("D64 gqa 2:1 B2 T300", shape(2, 300, 4, 2, 64), split);
  check_bounded_as_split("D128 gqa 2:1 B1 T300", shape(1, 300, 2, 1, 128), {split.begin(), split.begin() + 300});
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
  check_refused(masked(shape(1, 8, 2, 1, 64), -1, 0.0f), "a negative window");
  check_refused(masked(shape(1, 8, 2, 1, 64), 0, -2.0f), "a negative soft-cap");
  CHECK(cuda::flash_attention_tc_supports(shape(1, 8, 4, 1, 64))) << "D64 GQA is supported";
  CHECK(cuda::flash_attention_tc_supports(shape(1, 8, 2, 2, 128))) << "D128 MHA is supported";
  CHECK(cuda::flash_attention_tc_supports(masked(shape(1, 8, 4, 1, 64), 4, 0.0f))) << "a window is supported";
  CHECK(cuda::flash_attention_tc_supports(masked(shape(1, 8, 2, 2, 128), 0, 50.0f))) << "a soft-cap is supported";
  CHECK(cuda::flash_attention_tc_supports(masked(shape(1, 8, 2, 1, 64), 3, 2.0f))) << "both are supported";
}

}  // namespace
}  // namespace ktune
