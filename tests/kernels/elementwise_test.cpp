// Embedding, RMSNorm, gated activations, residual add and soft-capping: fast against reference,
// backward against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "gradient_check.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/rmsnorm.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

TEST(Embedding, ForwardGathersScaledRows) {
  const int64_t V = 11, C = 5, N = 6;
  auto table = random_vector(size_t(V * C), 1);
  std::vector<int32_t> ids = {3, 0, 10, 3, 7, 1};
  std::vector<float> out(size_t(N * C)), ref(size_t(N * C));
  embedding_forward(out.data(), ids.data(), table.data(), N, C, V, 2.5f);
  embedding_forward_reference(ref.data(), ids.data(), table.data(), N, C, 2.5f);
  EXPECT_EQ(out, ref);
  EXPECT_EQ(out[size_t(2 * C + 4)], table[size_t(10 * C + 4)] * 2.5f);
}

TEST(Embedding, BackwardAccumulatesRepeatedIdsAndMatchesFiniteDifferences) {
  const int64_t V = 9, C = 130, N = 12;
  auto table = random_vector(size_t(V * C), 2);
  std::vector<int32_t> ids = {1, 4, 4, 8, 0, 1, 1, 5, 4, 2, 3, 8};
  auto r = random_vector(size_t(N * C), 3);
  std::vector<float> dtable(size_t(V * C), 0.0f), ref(size_t(V * C), 0.0f);
  embedding_backward(dtable.data(), r.data(), ids.data(), N, C, 1.5f);
  embedding_backward_reference(ref.data(), r.data(), ids.data(), N, C, 1.5f);
  expect_close(dtable, ref, 1e-6, "dtable");
  for (int64_t c = 0; c < C; ++c) EXPECT_EQ(dtable[size_t(6 * C + c)], 0.0f) << "id 6 never used";
  auto loss = [&] {
    std::vector<float> out(size_t(N * C));
    embedding_forward(out.data(), ids.data(), table.data(), N, C, 1.5f);
    return dot(out, r);
  };
  expect_gradient_matches_finite_differences(loss, table, dtable, "dtable");
}

TEST(Embedding, RejectsIdsOutsideTheTable) {
  std::vector<float> table(20), out(10);
  std::vector<int32_t> ids = {0, 4};
  EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, 5, 4, 1.0f), ktune::Error);
  ids = {-1, 0};
  EXPECT_THROW(embedding_forward(out.data(), ids.data(), table.data(), 2, 5, 1.0f), ktune::Error);
}

class RmsNormTest : public ::testing::TestWithParam<float> {};  // weight_offset

TEST_P(RmsNormTest, ForwardAndBackwardMatchReference) {
  const float offset = GetParam();
  const int64_t N = 37, C = 203;
  auto x = random_vector(size_t(N * C), 4, -2, 2), w = random_vector(size_t(C), 5), dy = random_vector(size_t(N * C), 6);
  std::vector<float> y(size_t(N * C)), y_ref(y.size()), rstd(static_cast<size_t>(N)), rstd_ref(static_cast<size_t>(N));
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, offset);
  rmsnorm_forward_reference(y_ref.data(), rstd_ref.data(), x.data(), w.data(), N, C, 1e-5f, offset);
  expect_close(y, y_ref, 1e-5, "y");
  expect_close(rstd, rstd_ref, 1e-5, "rstd");
  std::vector<float> dx(y.size()), dx_ref(y.size()), dw(size_t(C), 0.5f), dw_ref(size_t(C), 0.5f);
  rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C, offset);
  rmsnorm_backward_reference(dx_ref.data(), dw_ref.data(), dy.data(), x.data(), w.data(), rstd.data(), N, C, offset);
  expect_close(dx, dx_ref, 1e-5, "dx");
  expect_close(dw, dw_ref, 1e-5, "dw");
  rmsnorm_backward(dx.data(), nullptr, dy.data(), x.data(), w.data(), rstd.data(), N, C, offset);
  expect_close(dx, dx_ref, 1e-5, "dx without dw");
}

TEST_P(RmsNormTest, BackwardMatchesFiniteDifferences) {
  const float offset = GetParam();
  const int64_t N = 5, C = 24;
  auto x = random_vector(size_t(N * C), 7, -2, 2), w = random_vector(size_t(C), 8), r = random_vector(size_t(N * C), 9);
  auto loss = [&] {
    std::vector<float> y(size_t(N * C)), rstd(static_cast<size_t>(N));
    rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, offset);
    return dot(y, r);
  };
  std::vector<float> y(size_t(N * C)), rstd(static_cast<size_t>(N)), dx(size_t(N * C)), dw(size_t(C), 0.0f);
  rmsnorm_forward(y.data(), rstd.data(), x.data(), w.data(), N, C, 1e-5f, offset);
  rmsnorm_backward(dx.data(), dw.data(), r.data(), x.data(), w.data(), rstd.data(), N, C, offset);
  expect_gradient_matches_finite_differences(loss, x, dx, "dx", 1e-3);
  expect_gradient_matches_finite_differences(loss, w, dw, "dw");
  std::vector<float> dx_ref(size_t(N * C)), dw_ref(size_t(C), 0.0f);
  rmsnorm_backward_reference(dx_ref.data(), dw_ref.data(), r.data(), x.data(), w.data(), rstd.data(), N, C, offset);
  expect_gradient_matches_finite_differences(loss, x, dx_ref, "reference dx", 1e-3);
}

TEST_P(RmsNormTest, NormalisesToUnitRootMeanSquare) {
  const int64_t C = 64;
  auto x = random_vector(size_t(C), 10, -3, 3);
  std::vector<float> w(size_t(C), 1.0f - GetParam()), y(static_cast<size_t>(C));
  float rstd;
  rmsnorm_forward(y.data(), &rstd, x.data(), w.data(), 1, C, 0.0f, GetParam());
  double ms = 0;
  for (float v : y) ms += double(v) * v;
  EXPECT_NEAR(ms / C, 1.0, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(PlainAndGemma, RmsNormTest, ::testing::Values(0.0f, 1.0f));

namespace {

using GatedForward = void (*)(float*, const float*, const float*, int64_t);
using GatedBackward = void (*)(float*, float*, const float*, const float*, const float*, int64_t);

void check_gated(GatedForward fwd, GatedForward fwd_ref, GatedBackward bwd, GatedBackward bwd_ref, const char* name) {
  const int64_t n = 10007;  // odd, and over the threading grain
  auto gate = random_vector(size_t(n), 11, -6, 6), up = random_vector(size_t(n), 12, -2, 2), dout = random_vector(size_t(n), 13);
  std::vector<float> out(static_cast<size_t>(n)), out_ref(static_cast<size_t>(n));
  fwd(out.data(), gate.data(), up.data(), n);
  fwd_ref(out_ref.data(), gate.data(), up.data(), n);
  expect_close(out, out_ref, 2e-6, std::string(name) + " forward");
  std::vector<float> dg(static_cast<size_t>(n)), du(static_cast<size_t>(n)), dg_ref(static_cast<size_t>(n)), du_ref(static_cast<size_t>(n));
  bwd(dg.data(), du.data(), dout.data(), gate.data(), up.data(), n);
  bwd_ref(dg_ref.data(), du_ref.data(), dout.data(), gate.data(), up.data(), n);
  expect_close(dg, dg_ref, 2e-6, std::string(name) + " dgate");
  expect_close(du, du_ref, 2e-6, std::string(name) + " dup");
  // Finite differences on a small slice.
  const int64_t m = 40;
  std::vector<float> g(gate.begin(), gate.begin() + m), u(up.begin(), up.begin() + m), r(dout.begin(), dout.begin() + m);
  auto loss = [&] {
    std::vector<float> o(static_cast<size_t>(m));
    fwd(o.data(), g.data(), u.data(), m);
    return dot(o, r);
  };
  std::vector<float> dgs(static_cast<size_t>(m)), dus(static_cast<size_t>(m));
  bwd(dgs.data(), dus.data(), r.data(), g.data(), u.data(), m);
  expect_gradient_matches_finite_differences(loss, g, dgs, std::string(name) + " dgate", 1e-3);
  expect_gradient_matches_finite_differences(loss, u, dus, std::string(name) + " dup", 1e-3);
}

}  // namespace

TEST(Activation, SwigluMatchesReferenceAndFiniteDifferences) {
  check_gated(swiglu_forward, swiglu_forward_reference, swiglu_backward, swiglu_backward_reference, "swiglu");
}

TEST(Activation, GegluTanhMatchesReferenceAndFiniteDifferences) {
  check_gated(geglu_tanh_forward, geglu_tanh_forward_reference, geglu_tanh_backward, geglu_tanh_backward_reference,
              "geglu_tanh");
}

TEST(Activation, GeluTanhMatchesKnownValues) {
  // torch.nn.functional.gelu(torch.tensor([-3., -1., 0.5, 2.]), approximate="tanh")
  const std::vector<float> g = {-3.0f, -1.0f, 0.5f, 2.0f}, up(4, 1.0f);
  const std::vector<float> expected = {-0.0036374330520629883f, -0.15880799293518066f, 0.34571400284767151f,
                                       1.9545977115631104f};
  std::vector<float> out(4);
  geglu_tanh_forward(out.data(), g.data(), up.data(), 4);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out[size_t(i)], expected[size_t(i)], 1e-6f) << i;
}

TEST(Activation, AddInplaceAndSoftcap) {
  const int64_t n = 20001;
  auto y = random_vector(size_t(n), 14), x = random_vector(size_t(n), 15);
  auto expected = y;
  for (int64_t i = 0; i < n; ++i) expected[size_t(i)] += x[size_t(i)];
  add_inplace(y.data(), x.data(), n);
  EXPECT_EQ(y, expected);

  auto z = random_vector(size_t(n), 16, -100, 100);
  auto capped = z;
  softcap_forward(capped.data(), n, 30.0f);
  for (int64_t i = 0; i < n; i += 97)
    EXPECT_NEAR(capped[size_t(i)], 30.0 * std::tanh(z[size_t(i)] / 30.0), 1e-4) << i;
  // backward against finite differences
  const int64_t m = 30;
  std::vector<float> s(z.begin(), z.begin() + m), r = random_vector(size_t(m), 17);
  auto loss = [&] {
    auto c = s;
    softcap_forward(c.data(), m, 30.0f);
    return dot(c, r);
  };
  auto c = s;
  softcap_forward(c.data(), m, 30.0f);
  auto ds = r;
  softcap_backward(ds.data(), c.data(), m, 30.0f);
  expect_gradient_matches_finite_differences(loss, s, ds, "softcap", 1e-2);
}
