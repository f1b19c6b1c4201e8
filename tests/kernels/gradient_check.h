// Test support for the kernel tests: seeded random buffers, element-wise comparison with a
// tolerance relative to the buffer's scale, and the central finite-difference check of a gradient.
// It deliberately holds no op-specific knowledge.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace ktune::cpu::testing {

inline bool sanitized() { return std::getenv("KTUNE_SANITIZED") != nullptr; }

inline std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Every element: |a - b| <= atol + rtol * max|b| (a tolerance on the scale of the whole buffer).
inline void expect_close(const std::vector<float>& actual, const std::vector<float>& expected, double rtol,
                         const std::string& what, double atol = 0.0) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double scale = 0;
  for (float e : expected) scale = std::max(scale, double(std::fabs(e)));
  double worst = 0;
  size_t worst_at = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double err = std::fabs(double(actual[i]) - double(expected[i]));
    if (!(err <= worst) || std::isnan(err)) {
      worst = std::isnan(err) ? INFINITY : err;
      worst_at = i;
    }
  }
  EXPECT_LE(worst, atol + rtol * scale) << what << ": worst at " << worst_at << " actual " << actual[worst_at]
                                        << " expected " << expected[worst_at] << " (scale " << scale << ")";
}

// Checks analytic d(loss)/d(x) against central differences (loss(x + h e_i) - loss(x - h e_i)) / 2h
// on up to max_coords coordinates spread over x and along three random directions.
// loss() reads x (which this function perturbs and restores) and returns a double.
inline void expect_gradient_matches_finite_differences(const std::function<double()>& loss, std::vector<float>& x,
                                                       const std::vector<float>& grad, const std::string& what,
                                                       double h = 1e-2, double rtol = 2e-3,
                                                       size_t max_coords = 24) {
  ASSERT_EQ(x.size(), grad.size()) << what;
  double gscale = 0;
  for (float g : grad) gscale = std::max(gscale, double(std::fabs(g)));
  ASSERT_GT(gscale, 0.0) << what << ": the analytic gradient is all zero, so the check would prove nothing";
  const size_t step = std::max<size_t>(1, x.size() / max_coords);
  for (size_t i = (x.size() > max_coords ? 7 % step : 0); i < x.size(); i += step) {
    const float saved = x[i];
    x[i] = saved + float(h);
    double plus = loss();
    x[i] = saved - float(h);
    double minus = loss();
    x[i] = saved;
    double actual_h = (double(saved + float(h)) - double(saved - float(h)));
    double fd = (plus - minus) / actual_h;
    EXPECT_NEAR(grad[i], fd, rtol * gscale + rtol * std::fabs(fd)) << what << " coordinate " << i;
  }
  std::mt19937 rng(12345);
  std::normal_distribution<double> normal;
  for (int d = 0; d < 3; ++d) {
    std::vector<double> u(x.size());
    double norm = 0;
    for (auto& ui : u) {
      ui = normal(rng);
      norm += ui * ui;
    }
    norm = std::sqrt(norm);
    double directional = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      u[i] /= norm;
      directional += u[i] * grad[i];
    }
    const std::vector<float> saved = x;
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(saved[i] + h * u[i]);
    double plus = loss();
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(saved[i] - h * u[i]);
    double minus = loss();
    x = saved;
    double fd = (plus - minus) / (2 * h);
    EXPECT_NEAR(directional, fd, rtol * gscale + rtol * std::fabs(fd)) << what << " random direction " << d;
  }
}

// sum(y * r) in double: the scalar loss whose gradient with respect to y is r.
inline double dot(const std::vector<float>& y, const std::vector<float>& r) {
  double acc = 0;
  for (size_t i = 0; i < y.size(); ++i) acc += double(y[i]) * r[i];
  return acc;
}

}  // namespace ktune::cpu::testing
