// RoPE against Hugging Face transformers (tables and rotations from fixtures/make_kernel_fixtures.py:
// no scaling, linear, llama3), the inverse rotation, finite differences and bad input.
#include "kernels/cpu/rope.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

nlohmann::json load_fixture(const std::string& name) {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/kernels/fixtures/" + name);
  EXPECT_TRUE(in.good()) << name;
  return nlohmann::json::parse(in);
}

RopeScaling scaling_of(const nlohmann::json& j) {
  RopeScaling s;
  if (j.contains("rope_type")) s.type = j["rope_type"].get<std::string>();
  if (j.contains("factor")) s.factor = j["factor"].get<float>();
  if (j.contains("low_freq_factor")) s.low_freq_factor = j["low_freq_factor"].get<float>();
  if (j.contains("high_freq_factor")) s.high_freq_factor = j["high_freq_factor"].get<float>();
  if (j.contains("original_max_position_embeddings"))
    s.original_max_position_embeddings = j["original_max_position_embeddings"].get<int64_t>();
  return s;
}

}  // namespace

TEST(Rope, TableAndRotationMatchHuggingFace) {
  auto fixture = load_fixture("rope_fixture.json");
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["name"];
    const int64_t D = c["head_dim"], H = c["heads"];
    RopeTable table(D, c["theta"].get<float>(), scaling_of(c["scaling"]), 16384);
    auto inv_freq = c["inv_freq"].get<std::vector<float>>();
    expect_close(table.inv_freq(), inv_freq, 1e-6, name + " inv_freq");
    auto positions = c["positions"].get<std::vector<int32_t>>();
    auto cos = c["cos"].get<std::vector<float>>(), sin = c["sin"].get<std::vector<float>>();
    std::vector<float> my_cos, my_sin;
    for (int32_t p : positions)
      for (int64_t i = 0; i < D / 2; ++i) {
        my_cos.push_back(table.cos(p)[i]);
        my_sin.push_back(table.sin(p)[i]);
      }
    // Angles up to 9000 rad in f32: both sides round position * inv_freq the same way.
    expect_close(my_cos, cos, 2e-6, name + " cos");
    expect_close(my_sin, sin, 2e-6, name + " sin");
    auto q = c["q"].get<std::vector<float>>();
    const auto expected = c["q_rot"].get<std::vector<float>>();
    const int64_t N = int64_t(positions.size());
    auto fast = q, ref = q;
    rope_forward(fast.data(), positions.data(), table, N, H, D);
    rope_forward_reference(ref.data(), positions.data(), table, N, H, D);
    expect_close(fast, expected, 2e-6, name + " rotation");
    expect_close(ref, expected, 2e-6, name + " reference rotation");
  }
}

TEST(Rope, BackwardIsTheInverseRotationAndMatchesFiniteDifferences) {
  const int64_t N = 7, H = 3, D = 16;
  RopeTable table(D, 10000.0f, RopeScaling{}, 64);
  std::vector<int32_t> positions = {0, 3, 1, 40, 63, 5, 5};
  auto x = random_vector(size_t(N * H * D), 1);
  auto y = x;
  rope_forward(y.data(), positions.data(), table, N, H, D);
  rope_backward(y.data(), positions.data(), table, N, H, D);
  expect_close(y, x, 1e-6, "backward(forward(x)) == x");
  auto r = random_vector(size_t(N * H * D), 2);
  auto loss = [&] {
    auto z = x;
    rope_forward(z.data(), positions.data(), table, N, H, D);
    return dot(z, r);
  };
  auto dx = r, dx_ref = r;
  rope_backward(dx.data(), positions.data(), table, N, H, D);
  rope_backward_reference(dx_ref.data(), positions.data(), table, N, H, D);
  expect_close(dx, dx_ref, 1e-6, "fast vs reference backward");
  expect_gradient_matches_finite_differences(loss, x, dx, "rope dx");
}

TEST(Rope, RejectsBadInput) {
  EXPECT_THROW(RopeTable(15, 10000.0f, RopeScaling{}, 8), ktune::Error);
  RopeScaling yarn;
  yarn.type = "yarn";
  EXPECT_THROW(RopeTable(16, 10000.0f, yarn, 8), ktune::Error);
  RopeTable table(4, 10000.0f, RopeScaling{}, 8);
  std::vector<float> x(4);
  std::vector<int32_t> pos = {8};
  EXPECT_THROW(rope_forward(x.data(), pos.data(), table, 1, 1, 4), ktune::Error);
  pos = {0};
  EXPECT_THROW(rope_forward(x.data(), pos.data(), table, 1, 1, 2), ktune::Error) << "head_dim mismatch";
}
