// Fused AdamW on the GPU against the CPU: f32 against the double reference over three steps, bf16
// with stochastic rounding against the CPU's bf16 step with the same seed (the same random bits:
// results agree bit for bit except where the f32 arithmetic rounds differently, then by one bf16
// step), and the GPU's stochastic rounding is unbiased where round-to-nearest would stall.
#include <cmath>

#include "cuda_test_harness.h"
#include "kernels/cpu/adamw.h"
#include "kernels/cuda/adamw.h"

namespace ktune {
namespace {

using cuda_test::from_device;
using cuda_test::random_floats;
using cuda_test::to_device;

KTUNE_CUDA_TEST(AdamWF32MatchesCpuReferenceOverThreeSteps) {
  const int64_t n = 10000;
  auto p = random_floats(static_cast<size_t>(n), 1), m = std::vector<float>(static_cast<size_t>(n), 0.0f), v = m;
  auto d_p = to_device(p), d_m = to_device(m), d_v = to_device(v);
  cpu::AdamWStep s{1e-3f};
  s.weight_decay = 0.01f;
  for (int64_t step = 1; step <= 3; ++step) {
    s.step = step;
    auto g = random_floats(static_cast<size_t>(n), uint32_t(100 + step), -0.1f, 0.1f);
    cpu::adamw_step_reference(p.data(), g.data(), m.data(), v.data(), n, s);
    auto d_g = to_device(g);
    cuda::adamw_step(d_p.as<float>(), d_g.as<float>(), d_m.as<float>(), d_v.as<float>(), n, s);
  }
  auto got_p = from_device<float>(d_p, p.size()), got_m = from_device<float>(d_m, m.size());
  auto got_v = from_device<float>(d_v, v.size());
  // f32 arithmetic vs double: a few ulp of each quantity (params ~1: 1e-6 absolute covers ~8 ulp).
  CHECK_CLOSE(got_p.data(), p.data(), n, 1e-6, 1e-6);
  CHECK_CLOSE(got_m.data(), m.data(), n, 1e-8, 1e-5);  // m cancels (lerp of +-0.01 terms): ~ulp(0.01) absolute
  CHECK_CLOSE(got_v.data(), v.data(), n, 1e-12, 1e-5);
}

int ulp_distance(bf16_t a, bf16_t b) {
  // bf16 bit patterns as a monotone integer line (sign-magnitude to two's complement).
  auto line = [](bf16_t h) { return (h & 0x8000) ? -int(h & 0x7fff) : int(h); };
  return std::abs(line(a) - line(b));
}

KTUNE_CUDA_TEST(AdamWBf16UsesTheCpuRandomBitsAndAgreesToOneBf16Step) {
  const int64_t n = 1 << 16;
  auto pf = random_floats(static_cast<size_t>(n), 2), mf = random_floats(static_cast<size_t>(n), 3, -1e-2f, 1e-2f);
  auto vf = random_floats(static_cast<size_t>(n), 4, 0.0f, 1e-4f), g = random_floats(static_cast<size_t>(n), 5, -1e-2f, 1e-2f);
  auto p = cuda_test::to_bf16(pf), m = cuda_test::to_bf16(mf), v = cuda_test::to_bf16(vf);
  auto d_p = to_device(p), d_m = to_device(m), d_v = to_device(v), d_g = to_device(g);
  cpu::AdamWStep s{2e-3f};
  s.weight_decay = 0.1f;
  s.step = 7;
  const uint64_t seed = 1234;
  cpu::adamw_step_bf16(p.data(), g.data(), m.data(), v.data(), n, s, seed);
  cuda::adamw_step_bf16(d_p.as<bf16_t>(), d_g.as<float>(), d_m.as<bf16_t>(), d_v.as<bf16_t>(), n, s, seed);
  auto got_p = from_device<bf16_t>(d_p, p.size()), got_m = from_device<bf16_t>(d_m, m.size());
  auto got_v = from_device<bf16_t>(d_v, v.size());
  int64_t identical = 0, far = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i);
    identical += got_p[k] == p[k] && got_m[k] == m[k] && got_v[k] == v[k];
    far += ulp_distance(got_p[k], p[k]) > 1 || ulp_distance(got_m[k], m[k]) > 1 || ulp_distance(got_v[k], v[k]) > 1;
  }
  // Other random bits would make ~half of all roundings differ; the same bits differ only where an
  // FMA contraction moved the f32 value across the random threshold (~1e-4 of the elements).
  CHECK(far == 0) << far << " elements differ by more than one bf16 step";
  CHECK(identical >= n * 99 / 100) << identical << " of " << n << " bit-identical";
}

KTUNE_CUDA_TEST(AdamWBf16StochasticRoundingIsUnbiased) {
  // Every param 1.0 with lr 1e-3 and a constant gradient: step 1 moves each by exactly -lr
  // (m_hat / sqrt(v_hat) = 1). 0.999 lies between the bf16 values 0.99609375 and 1.0, so rounding to
  // nearest would leave every param at 1.0; stochastic rounding gives 0.999 on average.
  const int64_t n = 1 << 18;
  std::vector<bf16_t> p(static_cast<size_t>(n), f32_to_bf16(1.0f)), m(static_cast<size_t>(n), 0), v(static_cast<size_t>(n), 0);
  std::vector<float> g(static_cast<size_t>(n), 0.5f);
  auto d_p = to_device(p), d_m = to_device(m), d_v = to_device(v), d_g = to_device(g);
  cpu::AdamWStep s{1e-3f};
  s.eps = 0.0f;
  s.step = 1;
  cuda::adamw_step_bf16(d_p.as<bf16_t>(), d_g.as<float>(), d_m.as<bf16_t>(), d_v.as<bf16_t>(), n, s, 99);
  auto got = from_device<bf16_t>(d_p, p.size());
  double sum = 0;
  int64_t down = 0, other = 0;
  for (bf16_t h : got) {
    float x = bf16_to_f32(h);
    other += x != 1.0f && x != 0.99609375f;
    sum += x;
    down += x != 1.0f;
  }
  CHECK(other == 0) << other << " params are neither neighbour of 0.999";
  const double mean = sum / double(n);
  // Standard error: 0.0039 * sqrt(p (1-p) / n) ~ 3.3e-6; 2e-5 is six of them.
  CHECK(std::fabs(mean - 0.999) < 2e-5) << "mean " << mean << " (" << down << " rounded down)";
}

// A sharded optimizer steps each slice of a tensor on its own rank: slices [0, a) and [a, n) with
// first = a round as one step over all n does, bit for bit (the random bits go by index in the tensor).
KTUNE_CUDA_TEST(AdamWBf16OnSlicesEqualsOneStepOverTheWholeTensor) {
  const int64_t n = 5000, a = 1728;
  auto p = cuda_test::to_bf16(random_floats(static_cast<size_t>(n), 21));
  auto m = cuda_test::to_bf16(random_floats(static_cast<size_t>(n), 22, -1e-2f, 1e-2f));
  auto v = cuda_test::to_bf16(random_floats(static_cast<size_t>(n), 23, 0.0f, 1e-4f));
  auto g = random_floats(static_cast<size_t>(n), 24, -1e-2f, 1e-2f);
  cpu::AdamWStep s{2e-3f};
  s.weight_decay = 0.1f;
  s.step = 3;
  auto whole_p = to_device(p), whole_m = to_device(m), whole_v = to_device(v), d_g = to_device(g);
  cuda::adamw_step_bf16(whole_p.as<bf16_t>(), d_g.as<float>(), whole_m.as<bf16_t>(), whole_v.as<bf16_t>(), n, s, 77);
  auto part_p = to_device(p), part_m = to_device(m), part_v = to_device(v);
  cuda::adamw_step_bf16(part_p.as<bf16_t>(), d_g.as<float>(), part_m.as<bf16_t>(), part_v.as<bf16_t>(), a, s, 77);
  cuda::adamw_step_bf16(part_p.as<bf16_t>() + a, d_g.as<float>() + a, part_m.as<bf16_t>() + a,
                        part_v.as<bf16_t>() + a, n - a, s, 77, nullptr, /*first=*/a);
  const auto want_p = from_device<bf16_t>(whole_p, p.size()), got_p = from_device<bf16_t>(part_p, p.size());
  const auto want_m = from_device<bf16_t>(whole_m, m.size()), got_m = from_device<bf16_t>(part_m, m.size());
  const auto want_v = from_device<bf16_t>(whole_v, v.size()), got_v = from_device<bf16_t>(part_v, v.size());
  int64_t differ = 0;
  for (size_t k = 0; k < p.size(); ++k) differ += got_p[k] != want_p[k] || got_m[k] != want_m[k] || got_v[k] != want_v[k];
  CHECK(differ == 0) << differ << " of " << n << " elements differ from the whole tensor's step";
}

KTUNE_CUDA_TEST(SumOfSquaresAndScaleMatchCpuForGradientClipping) {
  const int64_t n = 1000003;  // more than one pass of the 1024 x 256 grid, not a multiple of it
  auto x = random_floats(static_cast<size_t>(n), 6);
  const double want = cpu::sum_of_squares(x.data(), n);
  auto d_x = to_device(x);
  cuda::DeviceBuffer scratch(static_cast<size_t>(cuda::sum_of_squares_scratch_doubles()) * sizeof(double));
  cuda::sum_of_squares(scratch.as<double>(), d_x.as<float>(), n);
  double got = 0;
  scratch.download(&got, sizeof got);
  // Both accumulate in double (the CPU from f32 runs of 1024): agreement to ~1e-7 relative.
  CHECK(std::fabs(got - want) <= 1e-6 * want) << got << " vs " << want;
  cuda::scale_inplace(d_x.as<float>(), n, 0.25f);
  auto scaled = from_device<float>(d_x, x.size());
  for (auto& v : x) v *= 0.25f;
  CHECK_CLOSE(scaled.data(), x.data(), n, 0.0, 0.0);
}

// The ZeRO-2 accumulator's y += x: each element the f32 sum of its own pair, exactly; a length
// that is no multiple of a block, and y's neighbours (outside n) untouched.
KTUNE_CUDA_TEST(AccumulateInplaceAddsEachElementOnce) {
  const int64_t n = 70001;
  auto y = random_floats(static_cast<size_t>(n + 1), 31), x = random_floats(static_cast<size_t>(n), 32);
  auto d_y = to_device(y), d_x = to_device(x);
  cuda::accumulate_inplace(d_y.as<float>(), d_x.as<float>(), n);
  cuda::accumulate_inplace(d_y.as<float>(), d_x.as<float>(), n);  // twice: += accumulates
  auto got = from_device<float>(d_y, y.size());
  std::vector<float> want = y;
  for (int64_t i = 0; i < n; ++i) want[size_t(i)] = (y[size_t(i)] + x[size_t(i)]) + x[size_t(i)];
  CHECK_CLOSE(got.data(), want.data(), n + 1, 0.0, 0.0);
}

}  // namespace
}  // namespace ktune
