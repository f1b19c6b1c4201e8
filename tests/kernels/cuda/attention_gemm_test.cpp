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
// Row blocks (the GEMMs run per block of query rows, attention_gemm_block_rows): T = 129, 260, 300, 600
// make 2-4 blocks, the last partial, with windows shorter and longer than a block, doc ids and caps. The
// scratch is filled with NaN before each call: the outputs must equal a zeroed scratch's bit for bit (no
// row kernel reads a score the GEMMs skipped, no GEMM consumes an unwritten P / dS entry) and S and dP
// outside the blocks must stay NaN (not computed). One block of T, k0 one key later, or a key block's
// queries ending one early each fail it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_test_harness.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/attention_gemm.h"
#include "kernels/cuda/document_bounds.h"

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

// The operands of one case: bf16-exact q, k, v, dout, and the doc ids (empty: none).
struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<int32_t> docs;
  const int32_t* doc_ptr() const { return docs.empty() ? nullptr : docs.data(); }
};

struct Outputs {
  std::vector<float> out, lse, dq, dk, dv;
};

Inputs case_inputs(const cpu::AttentionShape& s, bool with_docs) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  return Inputs{rounded_to_bf16(random_floats(nq, 11)), rounded_to_bf16(random_floats(nkv, 12)),
                rounded_to_bf16(random_floats(nkv, 13)), rounded_to_bf16(random_floats(nq, 14)),
                with_docs ? packed_doc_ids(s.B, s.T) : std::vector<int32_t>()};
}

Outputs cpu_reference(const cpu::AttentionShape& s, const Inputs& in) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  Outputs r{std::vector<float>(nq), std::vector<float>(size_t(s.B * s.Hq * s.T)), std::vector<float>(nq),
            std::vector<float>(nkv), std::vector<float>(nkv)};
  cpu::attention_forward_reference(r.out.data(), r.lse.data(), in.q.data(), in.k.data(), in.v.data(), in.doc_ptr(), s);
  // The backward's rowsum uses the bf16-rounded forward output, as the GPU's does.
  const auto out_rounded = rounded_to_bf16(r.out);
  cpu::attention_backward_reference(r.dq.data(), r.dk.data(), r.dv.data(), in.dout.data(), in.q.data(), in.k.data(),
                                    in.v.data(), out_rounded.data(), r.lse.data(), in.doc_ptr(), s);
  return r;
}

// One GPU run (forward, then backward). The scratch is filled with `fill` bytes before each call (0xFF:
// NaN in f32 and bf16); the S and dP (B, T, T) f32 slices it holds after each call are returned too
// (attention_gemm.cu's layout: S at 0, dP next, 256-byte aligned).
struct GpuRun {
  Outputs got;
  std::vector<float> forward_S, backward_S, backward_dP;
};

// bounded: the doc ids' HostDocumentBounds passed too (document_bounds.h), so the GEMMs skip other documents.
GpuRun run_on_gpu(const cpu::AttentionShape& s, const Inputs& in, uint8_t fill, bool bounded = false) {
  const size_t nq = size_t(s.B * s.T * s.Hq * s.D), nkv = size_t(s.B * s.T * s.Hkv * s.D);
  const size_t tt = size_t(s.B * s.T * s.T), dp_offset = (tt * 4 + 255) / 256 * 256;
  std::vector<int32_t> first_key(in.docs.size()), last_query(in.docs.size());
  if (bounded) cuda::document_bounds(first_key.data(), last_query.data(), in.docs.data(), s.B, s.T);
  const cuda::HostDocumentBounds bounds =
      bounded ? cuda::HostDocumentBounds{first_key.data(), last_query.data()} : cuda::HostDocumentBounds{};
  cuda::GemmContext ctx;
  cuda::DeviceBuffer d_docs = in.docs.empty() ? cuda::DeviceBuffer() : to_device(in.docs);
  const int32_t* d_doc_ptr = in.docs.empty() ? nullptr : d_docs.as<int32_t>();
  auto d_q = to_device(to_bf16(in.q)), d_k = to_device(to_bf16(in.k)), d_v = to_device(to_bf16(in.v));
  auto d_dout = to_device(to_bf16(in.dout));
  cuda::DeviceBuffer d_out(nq * 2), d_dq(nq * 2), d_dk(nkv * 2), d_dv(nkv * 2), d_lse(size_t(s.B * s.Hq * s.T) * 4);
  const std::vector<uint8_t> filled(cuda::attention_gemm_scratch_bytes(s), fill);
  cuda::DeviceBuffer scratch = to_device(filled);
  auto slice = [&](size_t offset) {
    std::vector<float> v(tt);
    scratch.download(v.data(), tt * 4, offset);
    return v;
  };
  GpuRun r;
  cuda::attention_gemm_forward(ctx, d_out.as<bf16_t>(), d_lse.as<float>(), d_q.as<bf16_t>(), d_k.as<bf16_t>(),
                               d_v.as<bf16_t>(), s, scratch.data(), nullptr, d_doc_ptr, bounds);
  r.forward_S = slice(0);
  scratch.upload(filled.data(), filled.size());
  cuda::attention_gemm_backward(ctx, d_dq.as<bf16_t>(), d_dk.as<bf16_t>(), d_dv.as<bf16_t>(), d_dout.as<bf16_t>(),
                                d_q.as<bf16_t>(), d_k.as<bf16_t>(), d_v.as<bf16_t>(), d_out.as<bf16_t>(),
                                d_lse.as<float>(), s, scratch.data(), nullptr, d_doc_ptr, bounds);
  r.backward_S = slice(0), r.backward_dP = slice(dp_offset);
  r.got = Outputs{from_bf16(from_device<bf16_t>(d_out, nq)), from_device<float>(d_lse, size_t(s.B * s.Hq * s.T)),
                  from_bf16(from_device<bf16_t>(d_dq, nq)), from_bf16(from_device<bf16_t>(d_dk, nkv)),
                  from_bf16(from_device<bf16_t>(d_dv, nkv))};
  return r;
}

void check_against_reference(const char* name, const Outputs& got, const Outputs& ref) {
  CHECK_CLOSE(got.out.data(), ref.out.data(), int64_t(ref.out.size()), 2e-3, 1e-2) << name;
  CHECK_CLOSE(got.lse.data(), ref.lse.data(), int64_t(ref.lse.size()), 2e-5, 1e-5) << name;
  CHECK_CLOSE(got.dq.data(), ref.dq.data(), int64_t(ref.dq.size()), 6e-3, 1e-2) << name;
  CHECK_CLOSE(got.dk.data(), ref.dk.data(), int64_t(ref.dk.size()), 6e-3, 1e-2) << name;
  CHECK_CLOSE(got.dv.data(), ref.dv.data(), int64_t(ref.dv.size()), 6e-3, 1e-2) << name;
}

void check_gemm_attention(const char* name, cpu::AttentionShape s, bool with_docs = false) {
  const Inputs in = case_inputs(s, with_docs);
  check_against_reference(name, run_on_gpu(s, in, 0).got, cpu_reference(s, in));
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

// The GEMMs' row blocks: one block up to T = 128, then a quarter of T rounded up to 64 rows (>= 128).
KTUNE_CUDA_TEST(AttentionGemmRowBlocksPartitionT) {
  CHECK(cuda::attention_gemm_block_rows(1) == 1 && cuda::attention_gemm_block_rows(100) == 100);
  CHECK(cuda::attention_gemm_block_rows(128) == 128 && cuda::attention_gemm_block_rows(129) == 128);
  CHECK(cuda::attention_gemm_block_rows(300) == 128 && cuda::attention_gemm_block_rows(600) == 192);
  CHECK(cuda::attention_gemm_block_rows(2048) == 512) << cuda::attention_gemm_block_rows(2048);
}

// Row i of the block [i0, i1) gets S / dP in key columns [k0, i1) (k0 = max(0, i0 - window + 1) rounded
// down to a multiple of 8, 0 without a window; given the doc ids' first_key (B, T), at least the
// block's smallest first key in that batch row, before the rounding): those must be computed (finite),
// every other entry must still hold the NaN the scratch was filled with — the GEMMs did not compute it.
void check_written_in_blocks_only(const char* name, const char* what, const cpu::AttentionShape& s,
                                  const std::vector<float>& S, const std::vector<int32_t>& first_key = {}) {
  const int64_t T = s.T, n = cuda::attention_gemm_block_rows(T);
  int64_t outside = 0, missing = 0;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t i = 0; i < T; ++i) {
      const int64_t i0 = i / n * n, i1 = std::min(T, i0 + n), w = s.sliding_window;
      int64_t k0 = w > 0 ? std::max<int64_t>(0, i0 - w + 1) : 0;
      if (!first_key.empty()) {  // one call covers the B rows: the smallest of their blocks' starts
        int64_t doc_k0 = i0;
        for (int64_t r = 0; r < s.B; ++r) {
          const auto row = first_key.begin() + r * T;
          doc_k0 = std::min<int64_t>(doc_k0, std::max<int64_t>(k0, *std::min_element(row + i0, row + i1)) / 8 * 8);
        }
        k0 = doc_k0;
      }
      k0 = k0 / 8 * 8;
      for (int64_t j = 0; j < T; ++j) {
        const float x = S[size_t((b * T + i) * T + j)];
        if (k0 <= j && j < i1)
          missing += !std::isfinite(x);
        else
          outside += !std::isnan(x);
      }
    }
  CHECK(outside == 0 && missing == 0) << name << ": " << what << " has " << outside
                                      << " entries computed outside the row blocks, " << missing << " missing inside";
}

void check_equal_and_finite(const char* name, const char* what, const std::vector<float>& a,
                            const std::vector<float>& b) {
  int64_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) differ += !(std::isfinite(a[i]) && a[i] == b[i]);
  CHECK(differ == 0) << name << ": " << what << " differs from the run it is checked against (zero scratch, or no"
                     << " bounds) or is not finite at " << differ;
}

// The scratch filled with NaN before each call: the outputs equal (bit for bit) the run on a zeroed
// scratch and still match the CPU reference, so the row kernels read no score outside the row blocks
// and the GEMMs consume no P / dS entry they left unwritten; S and dP outside the blocks stay NaN.
void check_nan_scratch(const char* name, cpu::AttentionShape s, bool with_docs = false) {
  const Inputs in = case_inputs(s, with_docs);
  const GpuRun zeroed = run_on_gpu(s, in, 0), poisoned = run_on_gpu(s, in, 0xFF);
  check_against_reference(name, poisoned.got, cpu_reference(s, in));
  check_equal_and_finite(name, "out", poisoned.got.out, zeroed.got.out);
  check_equal_and_finite(name, "lse", poisoned.got.lse, zeroed.got.lse);
  check_equal_and_finite(name, "dq", poisoned.got.dq, zeroed.got.dq);
  check_equal_and_finite(name, "dk", poisoned.got.dk, zeroed.got.dk);
  check_equal_and_finite(name, "dv", poisoned.got.dv, zeroed.got.dv);
  check_written_in_blocks_only(name, "the forward's S", s, poisoned.forward_S);
  check_written_in_blocks_only(name, "the backward's S", s, poisoned.backward_S);
  check_written_in_blocks_only(name, "the backward's dP", s, poisoned.backward_dP);
}

// Several row blocks, the last one partial (T = 129: 128 + 1; 300: 128 x 2 + 44; 600: 192 x 3 + 24), with
// windows shorter and longer than a block (k0 > 0 from the second block on), doc ids and soft-caps.
KTUNE_CUDA_TEST(AttentionGemmRowBlocksSkipMaskedScoresOnNanScratch) {
  check_nan_scratch("gemm blocks causal mha D64 T129", shape(1, 129, 2, 2, 64));
  check_nan_scratch("gemm blocks causal gqa 4:2 D64 T300", shape(2, 300, 4, 2, 64));
  check_nan_scratch("gemm blocks window 50 gqa 4:2 D64 T300", windowed(shape(2, 300, 4, 2, 64), 50));
  check_nan_scratch("gemm blocks window 200 mqa 2:1 D32 T600", windowed(shape(1, 600, 2, 1, 32), 200));
  check_nan_scratch("gemm blocks window 1 gqa 2:1 D32 T300", windowed(shape(1, 300, 2, 1, 32), 1));
  check_nan_scratch("gemm blocks window 37 softcap 2 docs gqa 4:2 D64 T300",
                    windowed(softcapped(shape(2, 300, 4, 2, 64), 2.0f, 0.5f), 37), true);
  check_nan_scratch("gemm blocks softcap 50 docs mqa 4:1 D48 T260", softcapped(shape(2, 260, 4, 1, 48), 50.0f, 0.25f),
                    true);
  check_nan_scratch("gemm one block causal gqa 4:2 D64 T77", shape(2, 77, 4, 2, 64));
}

// Doc ids (B, T) from each batch row's document lengths, in order; the rest of the row is padding (-1).
std::vector<int32_t> doc_ids_of_lengths(int64_t T, const std::vector<std::vector<int64_t>>& lengths) {
  std::vector<int32_t> docs;
  for (const std::vector<int64_t>& row : lengths) {
    int32_t id = 0;
    for (int64_t n : row) docs.insert(docs.end(), size_t(n), id++);
    docs.resize(size_t(int64_t(docs.size() + T - 1) / T * T), -1);
  }
  return docs;
}

// attention_gemm_blocks by hand at T = 300 (blocks [0, 128), [128, 256), [256, 300)): the window's k0
// and q1, the documents' (k0: the block's smallest first key, rounded down to 8; q1: its keys' largest
// last query + 1, rounded up to 8), and both (the later k0, the earlier q1).
KTUNE_CUDA_TEST(AttentionGemmBlocksFollowDocumentBounds) {
  const int64_t T = 300;
  auto blocks = [&](int64_t window, const std::vector<int32_t>& docs) {
    std::vector<int32_t> first_key(docs.size()), last_query(docs.size());
    if (!docs.empty()) cuda::document_bounds(first_key.data(), last_query.data(), docs.data(), 1, T);
    std::vector<int64_t> k0, q1;
    for (const cuda::AttentionGemmBlock& r : cuda::attention_gemm_blocks(
             T, window, docs.empty() ? nullptr : first_key.data(), docs.empty() ? nullptr : last_query.data()))
      k0.push_back(r.k0), q1.push_back(r.q1);
    return std::make_pair(k0, q1);
  };
  using V = std::vector<int64_t>;
  const std::vector<int32_t> two = doc_ids_of_lengths(T, {{130, 170}}), three = doc_ids_of_lengths(T, {{5, 135, 150}});
  CHECK(blocks(0, {}) == std::make_pair(V{0, 0, 0}, V{300, 300, 300})) << "causal";
  CHECK(blocks(50, {}) == std::make_pair(V{0, 72, 200}, V{177, 300, 300})) << "window 50";
  CHECK(blocks(0, two) == std::make_pair(V{0, 0, 128}, V{136, 300, 300})) << "documents [0, 130), [130, 300)";
  CHECK(blocks(50, two) == std::make_pair(V{0, 72, 200}, V{136, 300, 300})) << "both, window 50";
  CHECK(blocks(0, three) == std::make_pair(V{0, 0, 136}, V{144, 296, 300})) << "[0, 5), [5, 140), [140, 290), pad";
  CHECK(blocks(100, three) == std::make_pair(V{0, 24, 152}, V{144, 296, 300})) << "the same, window 100";
}

// With the doc ids' bounds against without them and the CPU reference, on NaN scratch: on the
// emulator the same bits (the skipped keys and queries only add P = 0 and dS = 0 terms: its GEMMs sum
// in order from 0, and +0 + 0 * x = +0), on a GPU within the reference's tolerances (cuBLASLt may pick
// another algorithm for the narrower products); S and dP computed in the bounded blocks only.
void check_bounded(const char* name, const cpu::AttentionShape& s, const std::vector<int32_t>& docs) {
  Inputs in = case_inputs(s, false);
  in.docs = docs;
  const GpuRun plain = run_on_gpu(s, in, 0xFF), bounded = run_on_gpu(s, in, 0xFF, true);
  check_against_reference(name, bounded.got, cpu_reference(s, in));
  if (cuda::device_description().find("emulator") != std::string::npos) {
    check_equal_and_finite(name, "bounded out", bounded.got.out, plain.got.out);
    check_equal_and_finite(name, "bounded lse", bounded.got.lse, plain.got.lse);
    check_equal_and_finite(name, "bounded dq", bounded.got.dq, plain.got.dq);
    check_equal_and_finite(name, "bounded dk", bounded.got.dk, plain.got.dk);
    check_equal_and_finite(name, "bounded dv", bounded.got.dv, plain.got.dv);
  }
  std::vector<int32_t> first_key(docs.size()), last_query(docs.size());
  cuda::document_bounds(first_key.data(), last_query.data(), docs.data(), s.B, s.T);
  check_written_in_blocks_only(name, "the bounded forward's S", s, bounded.forward_S, first_key);
  check_written_in_blocks_only(name, "the bounded backward's S", s, bounded.backward_S, first_key);
  check_written_in_blocks_only(name, "the bounded backward's dP", s, bounded.backward_dP, first_key);
}

// Several documents of different lengths per row; rows 1 and 2 alike, row 0 not (one call over the
// union of their blocks); a window and a soft-cap. Row 1's keys [128, 256) are last seen by query 288, so
// their queries end at 296 (289 rounded up to 8): one query short of it misses 288.
KTUNE_CUDA_TEST(AttentionGemmDocumentBoundsSkipOtherDocumentsExactly) {
  const std::vector<int64_t> row_a{5, 123, 60, 40, 72}, row_b{130, 17, 1, 100, 41};  // row_b: 11 padding
  const std::vector<int32_t> docs = doc_ids_of_lengths(300, {row_a, row_b, row_b});
  check_bounded("gemm bounds causal mqa 2:1 D32 T300", shape(3, 300, 2, 1, 32), docs);
  check_bounded("gemm bounds window 50 softcap 2 gqa 4:2 D32 T300",
                windowed(softcapped(shape(3, 300, 4, 2, 32), 2.0f, 0.5f), 50), docs);
}

// got equals want (and is finite) at the tokens [from, to) of every batch row: (B, T, width) values,
// or lse's (B, Hq, T).
void check_tokens_equal(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                        const cpu::AttentionShape& s, bool lse, int64_t from, int64_t to) {
  const int64_t T = s.T, width = int64_t(got.size()) / (s.B * T);
  int64_t differ = 0;
  for (size_t x = 0; x < got.size(); ++x) {
    const int64_t i = lse ? int64_t(x) % T : int64_t(x) / width % T;
    if (from <= i && i < to) differ += !(std::isfinite(got[x]) && got[x] == want[x]);
  }
  CHECK(differ == 0) << what << " differs from the clean run (or is not finite) at " << differ << " values";
}

// Every row holds documents before `split` and others from it on, split a block boundary and a
// multiple of 8. NaN in k, v of the tokens before split must not reach the later tokens' out, lse, dq,
// dk, dv (their row blocks' keys start at split); NaN in q, dout from split on must not reach the
// earlier tokens' (their key block's queries end at split). Without the bounds each is 0 * NaN = NaN.
void check_other_documents_unread(const char* name, const cpu::AttentionShape& s, const std::vector<int32_t>& docs,
                                  int64_t split) {
  Inputs in = case_inputs(s, false);
  in.docs = docs;
  const GpuRun clean = run_on_gpu(s, in, 0, true);
  auto poisoned = [&](std::vector<float> x, int64_t H, int64_t from, int64_t to) {
    for (int64_t b = 0; b < s.B; ++b)
      std::fill(x.begin() + (b * s.T + from) * H * s.D, x.begin() + (b * s.T + to) * H * s.D,
                std::numeric_limits<float>::quiet_NaN());
    return x;
  };
  auto check_outputs = [&](const char* poison, const Outputs& got, int64_t from, int64_t to) {
    const std::string what = std::string(name) + ", NaN " + poison + ": ";
    check_tokens_equal(what + "out", got.out, clean.got.out, s, false, from, to);
    check_tokens_equal(what + "lse", got.lse, clean.got.lse, s, true, from, to);
    check_tokens_equal(what + "dq", got.dq, clean.got.dq, s, false, from, to);
    check_tokens_equal(what + "dk", got.dk, clean.got.dk, s, false, from, to);
    check_tokens_equal(what + "dv", got.dv, clean.got.dv, s, false, from, to);
  };
  Inputs early = in;
  early.k = poisoned(in.k, s.Hkv, 0, split), early.v = poisoned(in.v, s.Hkv, 0, split);
  check_outputs("in k, v before the split", run_on_gpu(s, early, 0, true).got, split, s.T);
  Inputs late = in;
  late.q = poisoned(in.q, s.Hq, split, s.T), late.dout = poisoned(in.dout, s.Hq, split, s.T);
  check_outputs("in q, dout from the split on", run_on_gpu(s, late, 0, true).got, 0, split);
}

KTUNE_CUDA_TEST(AttentionGemmDocumentBoundsLeaveNanInOtherDocumentsUnread) {
  const std::vector<int32_t> docs = doc_ids_of_lengths(300, {{40, 88, 72, 100}, {40, 88, 72, 87}});
  check_other_documents_unread("gemm bounds causal mqa 2:1 D32 T300", shape(2, 300, 2, 1, 32), docs, 128);
  check_other_documents_unread("gemm bounds window 50 softcap 2 mqa 2:1 D32 T300",
                               windowed(softcapped(shape(2, 300, 2, 1, 32), 2.0f, 0.5f), 50), docs, 128);
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
