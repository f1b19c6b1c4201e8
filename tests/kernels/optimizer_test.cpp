// AdamW against torch.optim.AdamW (fixtures/adamw_fixture.json), the bf16 stochastic variant's
// unbiasedness and determinism, and the clipping reductions.
#include "kernels/cpu/adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "gradient_check.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

TEST(AdamW, MatchesTorchOptimAdamWOverSeveralSteps) {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/kernels/fixtures/adamw_fixture.json");
  ASSERT_TRUE(in.good());
  auto f = nlohmann::json::parse(in);
  using Step = void (*)(float*, const float*, float*, float*, int64_t, const AdamWStep&);
  for (Step step_fn : {static_cast<Step>(adamw_step), static_cast<Step>(adamw_step_reference)}) {
    auto param = f["init"].get<std::vector<float>>();
    const int64_t n = int64_t(param.size());
    std::vector<float> m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    for (size_t t = 0; t < f["grads"].size(); ++t) {
      auto grad = f["grads"][t].get<std::vector<float>>();
      AdamWStep s{f["lr"].get<float>(), f["beta1"].get<float>(), f["beta2"].get<float>(), f["eps"].get<float>(),
                  f["weight_decay"].get<float>(), int64_t(t + 1)};
      step_fn(param.data(), grad.data(), m.data(), v.data(), n, s);
      expect_close(param, f["params"][t].get<std::vector<float>>(), 1e-6, "param after step " + std::to_string(t + 1));
      expect_close(m, f["m"][t].get<std::vector<float>>(), 1e-6, "exp_avg after step " + std::to_string(t + 1));
      expect_close(v, f["v"][t].get<std::vector<float>>(), 1e-6, "exp_avg_sq after step " + std::to_string(t + 1));
    }
  }
}

TEST(AdamW, FastMatchesReferenceOnALargeBuffer) {
  const int64_t n = 100003;
  auto p = random_vector(size_t(n), 1), g = random_vector(size_t(n), 2);
  auto m = random_vector(size_t(n), 3, -0.1f, 0.1f), v = random_vector(size_t(n), 4, 0.0f, 0.01f);
  auto p2 = p, m2 = m, v2 = v;
  AdamWStep s{3e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, 7};
  adamw_step(p.data(), g.data(), m.data(), v.data(), n, s);
  adamw_step_reference(p2.data(), g.data(), m2.data(), v2.data(), n, s);
  expect_close(p, p2, 1e-6, "param");
  expect_close(m, m2, 1e-6, "m");
  expect_close(v, v2, 1e-6, "v");
}

TEST(AdamW, RejectsStepZero) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_THROW(adamw_step(&p, &g, &m, &v, 1, AdamWStep{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 0}), ktune::Error);
}

TEST(AdamW, Bf16StochasticRoundingIsUnbiased) {
  // One step from param 1.0 with lr 1e-3 moves every element to 0.999 (Adam's first step is
  // lr * sign(g)); bf16 can hold only 0.99609375 or 1.0 there. Round-to-nearest would leave all at
  // 1.0 (a bias of 1e-3); stochastic rounding must average to 0.999.
  const int64_t n = 200000;
  std::vector<ktune::bf16_t> p(size_t(n), ktune::f32_to_bf16(1.0f)), m(size_t(n), 0), v(size_t(n), 0);
  std::vector<float> g(size_t(n), 0.5f);
  adamw_step_bf16(p.data(), g.data(), m.data(), v.data(), n, AdamWStep{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1}, 42);
  double mean = 0;
  for (auto x : p) mean += ktune::bf16_to_f32(x);
  mean /= double(n);
  // Each element is 1.0 or 0.99609375; stderr of the mean ~ 0.0039 * 0.5 / sqrt(n) ~ 4e-6.
  EXPECT_NEAR(mean, 0.999, 3e-5);
  double mean_m = 0;
  for (auto x : m) mean_m += ktune::bf16_to_f32(x);
  EXPECT_NEAR(mean_m / double(n), 0.05, 1e-5);  // m = (1 - 0.9) * 0.5
}

TEST(AdamW, Bf16IsDeterministicForASeedAndIndependentOfThreads) {
  const int64_t n = 50000;
  auto g = random_vector(size_t(n), 5);
  auto run = [&](uint64_t seed, int threads) {
    int saved = ktune::num_threads();
    ktune::set_num_threads(threads);
    std::vector<ktune::bf16_t> p(size_t(n), ktune::f32_to_bf16(0.3f)), m(size_t(n), 0), v(size_t(n), 0);
    adamw_step_bf16(p.data(), g.data(), m.data(), v.data(), n, AdamWStep{1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1}, seed);
    ktune::set_num_threads(saved);
    return p;
  };
  EXPECT_EQ(run(7, 1), run(7, 2));
  EXPECT_NE(run(7, 2), run(8, 2));
}

TEST(GradientClipping, SumOfSquaresAndScale) {
  const int64_t n = 123457;
  auto x = random_vector(size_t(n), 6);
  double expected = 0;
  for (float v : x) expected += double(v) * v;
  EXPECT_NEAR(sum_of_squares(x.data(), n), expected, 1e-6 * expected);
  scale_inplace(x.data(), n, 0.5f);
  EXPECT_NEAR(sum_of_squares(x.data(), n), expected / 4, 1e-6 * expected);
}
