// The fingerprints that replace the start-of-run broadcast (train/weights_fingerprint.h): equal for
// equal parameters whatever the thread count, different for one bit flipped anywhere (the first
// block, the zero-padded tail), another name, dtype or shape; and the check over three ranks (threads
// over Gloo) passing for equal ranks and naming the differing ranks and first parameter otherwise.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/parallel.h"
#include "train/weights_fingerprint.h"
#include "../sharded_test_fixture.h"

using namespace ktune;
using namespace ktune::train;

namespace {

// A bf16 parameter of n values (an odd n leaves a 2-byte tail after the 8-byte words), value i = i mod 251.
model::Parameter bf16_parameter(const std::string& name, int64_t n) {
  model::Parameter p;
  p.name = name;
  p.value = Tensor::empty({n}, DType::BF16);
  for (int64_t i = 0; i < n; ++i) p.value.bf16()[i] = f32_to_bf16(float(i % 251));
  return p;
}

model::Parameter copy_of(const model::Parameter& p) {
  model::Parameter c;
  c.name = p.name;
  c.value = Tensor::empty(p.value.shape(), p.value.dtype());
  std::memcpy(c.value.raw(), p.value.raw(), p.value.bytes());
  return c;
}

void flip_bit(model::Parameter& p, size_t byte, int bit) { static_cast<unsigned char*>(p.value.raw())[byte] ^= 1u << bit; }

// Three blocks of 1 MiB and a bit: several blocks to hash in parallel, and a tail.
constexpr int64_t kValues = 3 * (1 << 19) + 5;

}  // namespace

TEST(WeightsFingerprint, EqualForEqualParametersWhateverTheThreadCount) {
  const model::Parameter p = bf16_parameter("w", kValues);
  const int threads = num_threads();
  set_num_threads(1);
  const uint64_t one_thread = parameter_fingerprint(p);
  set_num_threads(3);
  const uint64_t three_threads = parameter_fingerprint(p);
  set_num_threads(threads);
  EXPECT_EQ(one_thread, three_threads);
  EXPECT_EQ(parameter_fingerprint(copy_of(p)), parameter_fingerprint(p));
}

TEST(WeightsFingerprint, OneBitAnywhereANameADtypeOrAShapeChangesIt) {
  const model::Parameter p = bf16_parameter("w", kValues);
  const uint64_t original = parameter_fingerprint(p);
  for (size_t byte : {size_t(0), size_t(1 << 20) + 3, p.value.bytes() - 1}) {  // first block, second, the tail
    model::Parameter q = copy_of(p);
    flip_bit(q, byte, 5);
    EXPECT_NE(parameter_fingerprint(q), original) << "byte " << byte;
  }
  model::Parameter renamed = copy_of(p);
  renamed.name.assign(1, 'v');
  EXPECT_NE(parameter_fingerprint(renamed), original);
  const model::Parameter bytes = copy_of(p);  // owns the bytes the views below read
  model::Parameter as_f16 = copy_of(p);      // the same bytes read as f16
  as_f16.value = Tensor::view(bytes.value.raw(), bytes.value.shape(), DType::F16);
  EXPECT_NE(parameter_fingerprint(as_f16), original);
  model::Parameter even = bf16_parameter("w", kValues - 1);
  const model::Parameter even_bytes = copy_of(even);
  model::Parameter reshaped = copy_of(even);  // the same bytes as (2, n/2)
  reshaped.value = Tensor::view(even_bytes.value.raw(), {2, (kValues - 1) / 2}, DType::BF16);
  EXPECT_NE(parameter_fingerprint(reshaped), parameter_fingerprint(even));
}

namespace {

// Three ranks (threads over Gloo), each with parameters a, b, c; `edit(rank, params)` makes a rank's
// differ. Returns each rank's error message ("" where check_same_parameters passed).
std::vector<std::string> check_three_ranks(const std::function<void(int, std::vector<model::Parameter>&)>& edit) {
  std::vector<std::string> errors(3);
  sharded_testing::run_ranks(3, "fingerprint", [&](int rank, dist::ProcessGroup& group) {
    std::vector<model::Parameter> params;
    for (const char* name : {"a", "b", "c"}) params.push_back(bf16_parameter(name, 1000));
    edit(rank, params);
    std::vector<model::Parameter*> pointers;
    for (model::Parameter& p : params) pointers.push_back(&p);
    try {
      check_same_parameters(pointers, group, "the starting weights");
    } catch (const Error& e) {
      errors[size_t(rank)] = e.what();
    }
  });
  return errors;
}

}  // namespace

TEST(WeightsFingerprint, RanksWithEqualParametersPass) {
  const std::vector<std::string> errors = check_three_ranks([](int, std::vector<model::Parameter>&) {});
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

TEST(WeightsFingerprint, EveryRankNamesTheRanksThatDifferAndTheFirstParameter) {
  const std::vector<std::string> errors = check_three_ranks([](int rank, std::vector<model::Parameter>& params) {
    if (rank == 1) flip_bit(params[2], 7, 0);  // c
    if (rank == 2) flip_bit(params[1], 0, 3);  // b
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[size_t(r)].find("the starting weights: rank 1 differs from rank 0 (so do ranks 2), first at c ("),
              std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
    EXPECT_EQ(errors[size_t(r)], errors[0]) << "rank " << r;
  }
}

TEST(WeightsFingerprint, ARankWithAnotherCountOfParametersIsNamed) {
  const std::vector<std::string> errors = check_three_ranks([](int rank, std::vector<model::Parameter>& params) {
    if (rank == 2) params.pop_back();
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[size_t(r)].find("rank 2 holds 2 parameters, rank 0 3"), std::string::npos)
        << "rank " << r << ": " << errors[size_t(r)];
}
