// Generation's attention against the cache, checked against the plain (T, T) attention over the
// whole sequence: the new tokens' rows of the full attention are what the cached kernel must give,
// for a prompt fed at once (past 0: training's tiled kernel), a few tokens after a past, one token a
// step, and each mask.
#include "kernels/cpu/cached_attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/attention.h"
#include "gradient_check.h"

using namespace ktune::cpu;
using namespace ktune::cpu::testing;

namespace {

struct Case {
  std::string name;
  int64_t length, n, Hq, Hkv, D;
  float scale;
  int64_t sliding_window = 0;
  float softcap = 0;
};

void compare_with_full_attention(const Case& c) {
  const AttentionShape full{1, c.length, c.Hq, c.Hkv, c.D, c.scale, c.sliding_window, c.softcap};
  const size_t q_row = size_t(c.Hq * c.D);
  const size_t nq = size_t(c.length) * q_row, nkv = size_t(c.length * c.Hkv * c.D);
  auto q = random_vector(nq, 11, -2, 2), k = random_vector(nkv, 12, -2, 2), v = random_vector(nkv, 13);
  std::vector<float> out_full(nq), lse(size_t(c.Hq * c.length));
  attention_forward_reference(out_full.data(), lse.data(), q.data(), k.data(), v.data(), nullptr, full);

  const int64_t past = c.length - c.n;
  const std::vector<float> q_new(q.begin() + long(size_t(past) * q_row), q.end());
  std::vector<float> out(size_t(c.n) * q_row, NAN);
  cached_attention_forward(out.data(), q_new.data(), k.data(), v.data(),
                           {c.n, c.length, c.Hq, c.Hkv, c.D, c.scale, c.sliding_window, c.softcap});
  const std::vector<float> expected(out_full.begin() + long(size_t(past) * q_row), out_full.end());
  expect_close(out, expected, 2e-5, c.name);
}

}  // namespace

TEST(CachedAttention, NewRowsMatchTheFullAttentionAcrossFeatures) {
  const std::vector<Case> cases = {
      {"prompt at once", 37, 37, 4, 4, 16, 0.25f},
      {"one token after 40", 41, 1, 4, 4, 16, 0.25f},
      {"five tokens after 30", 35, 5, 4, 2, 16, 0.25f},
      {"the first token alone", 1, 1, 2, 1, 8, 0.3f},
      {"GQA 8/2, one token", 64, 1, 8, 2, 32, 1.0f / std::sqrt(32.0f)},
      {"MQA 3/1, three tokens", 20, 3, 3, 1, 8, 0.35f},
      {"window 10 shorter than the past", 50, 4, 4, 2, 16, 0.25f, 10},
      {"window longer than the sequence", 20, 2, 2, 2, 8, 0.25f, 64},
      {"window 1 (self only)", 15, 3, 2, 1, 8, 0.25f, 1},
      {"softcap 5", 33, 2, 2, 2, 16, 0.7f, 0, 5.0f},
      {"window and softcap, prompt at once", 40, 40, 6, 3, 24, 0.3f, 16, 8.0f},
      {"a long prompt at once, GQA 8/2 (many tiles of queries and keys)", 150, 150, 8, 2, 32, 0.18f},
      {"a long prompt at once, window 37 and softcap 20", 130, 130, 4, 2, 16, 0.25f, 37, 20.0f},
  };
  for (const auto& c : cases) compare_with_full_attention(c);
}

TEST(CachedAttention, RefusesMoreNewTokensThanTheCacheHoldsAndUnevenHeads) {
  std::vector<float> buffer(1024);
  EXPECT_THROW(cached_attention_forward(buffer.data(), buffer.data(), buffer.data(), buffer.data(),
                                        {5, 4, 2, 2, 8, 0.3f}),
               ktune::Error);
  EXPECT_THROW(cached_attention_forward(buffer.data(), buffer.data(), buffer.data(), buffer.data(),
                                        {1, 4, 3, 2, 8, 0.3f}),
               ktune::Error);
}
