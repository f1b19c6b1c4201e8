// NF4: torchao's (torchtune's QLoRA's) codes, scales and dequantised values bit for bit
// (fixtures/nf4_fixture.json, made by make_nf4_fixture.py with torchao 0.10), the blockwise quantiser
// against the plain reference, the code tables, the nibble order, the double quantisation's groups,
// and the linear ops against a linear layer on the dequantised weight.
#include "kernels/cpu/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/random_bits.h"
#include "gradient_check.h"
#include "kernels/cpu/linear.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

constexpr Nf4Arithmetic kBf16 = Nf4Arithmetic::kBf16, kF32 = Nf4Arithmetic::kF32;

int code_at(const std::vector<uint8_t>& codes, int64_t i) {
  return (i & 1) ? codes[size_t(i / 2)] & 15 : codes[size_t(i / 2)] >> 4;
}

float bf16_rounded(float x) { return ktune::bf16_to_f32(ktune::f32_to_bf16(x)); }

struct Quantised {
  std::vector<uint8_t> codes;
  Nf4Scales held;             // as the adapters hold them: torchao's int8 scalers (none for the reference)
  std::vector<float> scales;  // each block's scale as an f32
};

// The codes and scales as nf4_quantize holds them, each block's scale (Nf4Scales::scale) beside them,
// checked against the f32 overload's; or the reference's.
Quantised quantise(const std::vector<float>& x, Nf4Arithmetic arithmetic, bool reference = false) {
  const int64_t n = int64_t(x.size());
  Quantised q{std::vector<uint8_t>(size_t(n / 2)), Nf4Scales(), std::vector<float>(size_t(n / 64))};
  if (reference) {
    nf4_quantize_reference(q.codes.data(), q.scales.data(), x.data(), n, arithmetic);
    return q;
  }
  nf4_quantize(q.codes.data(), q.held, x.data(), n, arithmetic);
  EXPECT_EQ(q.held.blocks(), n / 64);
  for (int64_t b = 0; b < n / 64; ++b) q.scales[size_t(b)] = q.held.scale(b, arithmetic);
  std::vector<uint8_t> codes(size_t(n / 2));
  std::vector<float> scales(size_t(n / 64));
  nf4_quantize(codes.data(), scales.data(), x.data(), n, arithmetic);
  EXPECT_EQ(codes, q.codes) << "the f32 overload's codes";
  EXPECT_EQ(scales, q.scales) << "the f32 overload's scales";
  return q;
}

// make_nf4_fixture.py's inputs, computed in f32 in the same order of operations (so the same bits),
// from the same splitmix64 (core/random_bits.h).

std::vector<float> fixture_inputs(int64_t numel, uint64_t seed, bool equal_absmax, int64_t zero_block) {
  std::vector<float> x(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    const uint64_t u = ktune::splitmix64(uint64_t(i) ^ seed) >> 40;
    const float centred = float(int64_t(u) - (int64_t(1) << 23)) * 0x1p-23f;
    if (equal_absmax) {
      x[size_t(i)] = i % 64 == 0 ? 0.5f : centred * 0.5f;
      continue;
    }
    const uint64_t hb = ktune::splitmix64(uint64_t(i / 64 + 0x5EED) ^ seed);
    const int k = int((hb >> 60) % 6), m = int((hb >> 56) % 3);
    x[size_t(i)] = centred * std::ldexp(1.0f, -k) * (1.0f + float(m) / 4.0f);
  }
  if (zero_block >= 0) std::fill(x.begin() + zero_block * 64, x.begin() + (zero_block + 1) * 64, 0.0f);
  return x;
}

std::vector<uint8_t> from_hex(const std::string& hex) {
  std::vector<uint8_t> bytes(hex.size() / 2);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  return bytes;
}

}  // namespace

TEST(Nf4, CodeTablesAreTorchaosAndTheirBf16Rounding) {
  // torchao.dtypes.nf4tensor (NF4Tensor.from_tensor): bitsandbytes' NF4 values written to 4 decimals.
  const double torchao[16] = {-1.0,   -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0,
                              0.0796, 0.1609,  0.2461,  0.3379,  0.4407,  0.5626,  0.7230,  1.0};
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(kNf4Codes[i], float(torchao[i])) << i;
    EXPECT_EQ(kNf4CodesBf16[i], bf16_rounded(kNf4Codes[i])) << i;
  }
  // Where torchao's 4 decimals part from bitsandbytes' exact value once rounded to bf16: code 6.
  EXPECT_NE(kNf4CodesBf16[6], bf16_rounded(-0.09105003625154495f));
  EXPECT_STREQ(nf4_arithmetic_name(kBf16), "bf16");
  EXPECT_STREQ(nf4_arithmetic_name(kF32), "f32");
}

// torchao's output for make_nf4_fixture.py's tensors: the packed codes, the scales its dequantiser
// multiplies by (its int8 scalers / factor + mean), and the dequantised values, all to the bit in
// bf16 (torchtune's default dtype; in f32 the codes to the bit, the scales within an ulp); a block of zeros (0/0: torchao's code 0, -1.0 times a
// scale near 0) and a tensor whose blocks' absmax are all equal (factor infinite: every scale the mean).
TEST(Nf4, QuantisesAsTorchaoBitForBit) {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/kernels/fixtures/nf4_fixture.json");
  ASSERT_TRUE(in) << "tests/kernels/fixtures/nf4_fixture.json";
  const nlohmann::json fixture = nlohmann::json::parse(in);
  ASSERT_EQ(fixture["cases"].size(), 3u);
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"];
    const Nf4Arithmetic arithmetic = c["dtype"] == "bf16" ? kBf16 : kF32;
    const int64_t n = int64_t(c["rows"]) * int64_t(c["cols"]);
    const std::vector<float> x = fixture_inputs(n, c["seed"], c["equal_absmax"], c["zero_block"]);
    const Quantised q = quantise(x, arithmetic);
    EXPECT_EQ(q.codes, from_hex(c["codes_hex"])) << name << ": codes";
    const std::vector<float> scales = c["scales"], dequantised = c["dequantised_first"];
    const std::vector<int> scalers = c["quantized_scalers"];
    std::vector<float> factors;
    for (const auto& f : c["quantization_factor"])
      factors.push_back(f.is_string() ? std::stof(f.get<std::string>()) : f.get<float>());  // "inf"
    const float mean = c["scaler_mean"];
    std::vector<int> held_scalers(q.held.quantized.begin(), q.held.quantized.end());
    std::vector<float> ours(dequantised.size());
    nf4_dequantize_range(ours.data(), q.codes.data(), q.held, 0, int64_t(ours.size()), arithmetic);
    if (arithmetic == kBf16) {
      EXPECT_EQ(held_scalers, scalers) << name << ": int8 scalers";
      EXPECT_EQ(q.held.factors, factors) << name << ": quantisation factors";
      EXPECT_EQ(q.held.mean, mean) << name << ": scaler mean";
      EXPECT_EQ(q.scales, scales) << name << ": scales";
      EXPECT_EQ(ours, dequantised) << name << ": dequantised values";
    } else {  // f32: the scales' mean is the correctly rounded one; torch's f32 sum may be an ulp off it
      ASSERT_EQ(held_scalers.size(), scalers.size());
      for (size_t b = 0; b < scalers.size(); ++b) ASSERT_LE(std::abs(held_scalers[b] - scalers[b]), 1) << name << " " << b;
      expect_close(q.held.factors, factors, 1e-6, "f32 quantisation factors");
      EXPECT_NEAR(q.held.mean, mean, 1e-6 * std::fabs(mean));
      expect_close(q.scales, scales, 1e-6, "f32 scales");
      expect_close(ours, dequantised, 1e-6, "f32 dequantised values");
    }
    const Quantised reference = quantise(x, arithmetic, /*reference=*/true);
    EXPECT_EQ(reference.codes, q.codes) << name << ": the reference's codes";
    EXPECT_EQ(reference.scales, q.scales) << name << ": the reference's scales";
    if (c["zero_block"] >= 0) {  // torchao: 0/0 is NaN, whose nearest code is code 0
      const int64_t b = c["zero_block"];
      for (int64_t i = 64 * b; i < 64 * (b + 1); ++i) ASSERT_EQ(code_at(q.codes, i), 0) << name << " value " << i;
    }
  }
}

// The blockwise quantiser (bf16: a table of the 65536 bf16 values' codes; f32: the 16 distances a code
// at a time across the block) against the reference (each value's 16 distances in turn), bit for bit:
// random blocks, values exactly between two codes (ties: the first code), signed zeros, a block of
// zeros, a tiny value, a block under a negative absmax, in both arithmetics.
TEST(Nf4, TheBlockwiseQuantiserGivesTheReferencesCodesAndScales) {
  const int64_t blocks = 603, n = 64 * blocks;  // 3 groups of scalers, the last shorter
  auto x = random_vector(size_t(n), 7, -2, 2);
  for (int64_t i = 0; i < 64; ++i) x[size_t(64 * 3 + i)] = 0.0f;
  for (int64_t i = 0; i < 64; ++i) x[size_t(64 * 4 + i)] = (i % 2 ? -0.0f : 0.0f);
  x[size_t(64 * 4 + 5)] = 1e-30f;
  for (int64_t b = 5; b < 13; ++b) {  // halfway between neighbouring codes, a block's absmax 1.5 (or -1.5) first
    const float* table = b < 9 ? kNf4CodesBf16 : kNf4Codes;
    x[size_t(64 * b)] = b % 2 ? -1.5f : 1.5f;
    for (int64_t i = 1; i < 64; ++i) {
      const int c = int((i - 1) % 15);
      x[size_t(64 * b + i)] = 0.5f * (table[c] + table[c + 1]) * 1.5f * (i > 32 ? -1.0f : 1.0f);
    }
  }
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    const Quantised fast = quantise(x, arithmetic), reference = quantise(x, arithmetic, true);
    EXPECT_EQ(fast.codes, reference.codes) << nf4_arithmetic_name(arithmetic);
    EXPECT_EQ(fast.scales, reference.scales) << nf4_arithmetic_name(arithmetic);
  }
}

// The quantiser's two steps over a tensor read a piece at a time (the adapters and the GPU upload):
// the codes and absmax of each piece's blocks, or the absmax alone, then the scales of the whole tensor.
TEST(Nf4, QuantisingInPiecesGivesTheWholeTensorsCodesAndScales) {
  const int64_t n = 64 * 700;
  auto x = random_vector(size_t(n), 8, -0.3f, 0.3f);
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    const Quantised whole = quantise(x, arithmetic);
    std::vector<uint8_t> codes(size_t(n / 2));
    std::vector<float> scales(size_t(n / 64)), absmax_only(size_t(n / 64));
    for (int64_t first = 0; first < n; first += 64 * 97) {
      const int64_t m = std::min<int64_t>(64 * 97, n - first);
      nf4_quantize_blocks(codes.data() + first / 2, scales.data() + first / 64, x.data() + first, m, arithmetic);
    }
    nf4_block_absmax(absmax_only.data(), x.data(), n, arithmetic);
    EXPECT_EQ(absmax_only, scales);
    Nf4Scales held;
    nf4_double_quantize(held, scales.data(), n / 64, arithmetic);
    nf4_double_quantize_scales(scales.data(), n / 64, arithmetic);
    EXPECT_EQ(codes, whole.codes);
    EXPECT_EQ(scales, whole.scales);
    EXPECT_EQ(held.quantized, whole.held.quantized);
    EXPECT_EQ(held.factors, whole.held.factors);
    EXPECT_EQ(held.mean, whole.held.mean);
  }
}

// Each scale is its block's absmax to within a step of its group's int8 grid (the group's largest
// |absmax - mean| / 128: half a step of rounding, a whole one where +128 is clamped to 127; under bf16
// two, and bf16's rounding of the absmax), the grid each group of
// 256 blocks' own: blocks of absmax near 4, near 0.05, and a last, shorter group near the mean, whose
// grid is fine where one grid for the tensor would step by ~2 / 128.
TEST(Nf4, ScalesAreDoubleQuantisedInGroupsOf256) {
  const int64_t blocks = 2 * 256 + 40, n = 64 * blocks;
  const float group_scale[3] = {4.0f, 0.05f, 2.03f};
  std::vector<float> x(static_cast<size_t>(n));
  auto r = random_vector(size_t(n), 9, -1, 1);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = r[size_t(i)] * group_scale[i / 64 / 256];
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    std::vector<float> absmax(static_cast<size_t>(blocks));
    nf4_block_absmax(absmax.data(), x.data(), n, arithmetic);
    double mean = 0;
    for (float a : absmax) mean += a;
    mean /= double(blocks);
    const Quantised q = quantise(x, arithmetic);
    double last_group_error = 0;
    for (int64_t g0 = 0; g0 < blocks; g0 += 256) {
      const int64_t g1 = std::min(blocks, g0 + 256);
      double largest = 0;
      for (int64_t b = g0; b < g1; ++b) largest = std::max(largest, std::fabs(absmax[size_t(b)] - mean));
      for (int64_t b = g0; b < g1; ++b) {
        const double a = absmax[size_t(b)], error = std::fabs(q.scales[size_t(b)] - a);
        const double step = largest / 128;  // 1 / factor
        const double bound = arithmetic == kF32 ? step * 1.001 + 1e-6 : 2 * step + std::ldexp(a, -7);
        ASSERT_LE(error, bound) << nf4_arithmetic_name(arithmetic) << " block " << b;
        if (g0 == 512) last_group_error = std::max(last_group_error, error);
      }
    }
    if (arithmetic == kF32) {
      EXPECT_LT(last_group_error, 0.002) << "the last group's grid is its own";
    }
  }
}

TEST(Nf4, PacksTheFirstValueInTheHighNibble) {
  std::vector<float> x(64, 0.0f);
  x[0] = -2.0f;  // absmax: code 0 (-1.0)
  x[1] = 2.0f;   // code 15 (+1.0)
  x[2] = 0.0f;   // code 7
  x[3] = 0.16f;  // 0.08 of absmax: nearest 0.0796 (code 8)
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    const Quantised q = quantise(x, arithmetic);
    EXPECT_EQ(q.scales[0], 2.0f) << "one block: its absmax is the mean, and the scale";
    EXPECT_EQ(q.codes[0], 0x0f);
    EXPECT_EQ(q.codes[1], 0x78);
    EXPECT_EQ(q.codes[2], 0x77);
  }
}

// Dequantised: bf16(code · scale) under bf16, code · scale under f32; every value within half the widest
// gap between codes (-0.6962 to -1.0) of its block's absmax, plus the scale's error.
TEST(Nf4, DequantisedValuesAreTheNearestCodeTimesTheScale) {
  const int64_t n = 64 * 301;
  auto x = random_vector(size_t(n), 1, -3, 3);
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    const Quantised q = quantise(x, arithmetic);
    std::vector<float> back(static_cast<size_t>(n)), absmax(size_t(n / 64));
    nf4_dequantize(back.data(), q.codes.data(), q.held, n, arithmetic);
    nf4_block_absmax(absmax.data(), x.data(), n, arithmetic);
    const float* table = arithmetic == kBf16 ? kNf4CodesBf16 : kNf4Codes;
    for (int64_t i = 0; i < n; ++i) {
      const float s = q.scales[size_t(i / 64)], a = absmax[size_t(i / 64)];
      const float product = table[code_at(q.codes, i)] * s;
      ASSERT_EQ(back[size_t(i)], arithmetic == kBf16 ? bf16_rounded(product) : product) << i;
      ASSERT_EQ(back[size_t(i)], nf4_value(uint8_t(code_at(q.codes, i)), s, arithmetic)) << i;
      const double err = std::fabs(double(back[size_t(i)]) - x[size_t(i)]);
      ASSERT_LE(err, 0.5 * (1.0 - 0.6962) * a + std::fabs(s - a) + 0.01 * a) << i;
    }
  }
}

TEST(Nf4, DequantiseRangeHandlesUnalignedBounds) {
  const int64_t n = 256;
  auto x = random_vector(size_t(n), 2);
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    const Quantised q = quantise(x, arithmetic);
    std::vector<float> all(static_cast<size_t>(n)), all_f32(static_cast<size_t>(n)), part(50), part_f32(50);
    nf4_dequantize(all.data(), q.codes.data(), q.held, n, arithmetic);
    nf4_dequantize(all_f32.data(), q.codes.data(), q.scales.data(), n, arithmetic);
    nf4_dequantize_range(part.data(), q.codes.data(), q.held, 61, 111, arithmetic);
    nf4_dequantize_range(part_f32.data(), q.codes.data(), q.scales.data(), 61, 111, arithmetic);
    EXPECT_EQ(all, all_f32) << "the held scales and their f32 values dequantise alike";
    EXPECT_EQ(part, part_f32);
    for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(part[size_t(i)], all[size_t(61 + i)]);
  }
}

TEST(Nf4, RejectsPartialBlocks) {
  std::vector<float> x(65);
  std::vector<uint8_t> codes(40);
  std::vector<float> scales(2);
  Nf4Scales held;
  EXPECT_THROW(nf4_quantize(codes.data(), scales.data(), x.data(), 65, kBf16), ktune::Error);
  EXPECT_THROW(nf4_quantize(codes.data(), held, x.data(), 65, kBf16), ktune::Error);
  EXPECT_THROW(nf4_quantize_blocks(codes.data(), scales.data(), x.data(), 65, kF32), ktune::Error);
}

TEST(Nf4, LinearOpsMatchLinearOnTheDequantisedWeight) {
  // in = 96 is not a multiple of 64: blocks straddle rows. out large enough for several row blocks.
  for (Nf4Arithmetic arithmetic : {kBf16, kF32}) {
    for (auto [N, in, out] : {std::tuple<int64_t, int64_t, int64_t>{13, 96, 40}, {5, 3008, 300}}) {
      auto w = random_vector(size_t(out * in), 3);
      const Quantised q = quantise(w, arithmetic);
      std::vector<float> wd(size_t(out * in));
      nf4_dequantize(wd.data(), q.codes.data(), q.held, out * in, arithmetic);
      auto x = random_vector(size_t(N * in), 4), dy = random_vector(size_t(N * out), 5);
      std::vector<float> scratch(nf4_linear_scratch_floats(in, out));
      EXPECT_LT(scratch.size(), size_t(out * in) + 1);
      std::vector<float> y(size_t(N * out)), y_ref(size_t(N * out));
      nf4_linear_forward(y.data(), x.data(), q.codes.data(), q.held, N, in, out, arithmetic, scratch.data());
      linear_forward_reference(y_ref.data(), x.data(), wd.data(), nullptr, N, in, out);
      expect_close(y, y_ref, 1e-5, "nf4 forward");
      for (bool accumulate : {false, true}) {
        auto dx = random_vector(size_t(N * in), 6);
        auto dx_ref = dx;
        nf4_linear_backward_input(dx.data(), dy.data(), q.codes.data(), q.held, N, in, out, arithmetic,
                                  scratch.data(), accumulate);
        linear_backward_reference(dx_ref.data(), nullptr, nullptr, dy.data(), x.data(), wd.data(), N, in, out,
                                  accumulate);
        expect_close(dx, dx_ref, 1e-5, "nf4 backward input");
      }
    }
  }
}

TEST(Nf4, ScratchIsABlockOfRowsNotTheWholeWeight) {
  EXPECT_LT(nf4_linear_scratch_floats(4096, 14336), size_t(4096) * 14336 / 8);
}

// What a tensor's scales take held as torchao holds them: a byte a block of 64, an f32 a group of 256
// blocks and one mean, 4.127 bits a value with the codes (an f32 a block would be 4.5).
TEST(Nf4, ScalesAreHeldAsInt8ScalersAFactorAGroupAndAMean) {
  const int64_t blocks = 600, n = 64 * blocks;  // 3 groups, the last shorter
  const Quantised q = quantise(random_vector(size_t(n), 10), kBf16);
  EXPECT_EQ(q.held.quantized.size(), size_t(blocks));
  EXPECT_EQ(q.held.factors.size(), size_t(3));
  EXPECT_EQ(nf4_scale_groups(blocks), 3);
  EXPECT_EQ(q.held.bytes(), size_t(blocks + 4 * 4));
  const double bits = 8.0 * double(q.codes.size() + q.held.bytes()) / double(n);
  EXPECT_LT(bits, 4.13);
}
