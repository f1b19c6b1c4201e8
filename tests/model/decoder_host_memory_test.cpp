// What a decoder whose steps run elsewhere (the GPU step) keeps on the host: set_host_gradients(false)
// frees every gradient, allocates none later and refuses a backward; release_values frees the
// values it selects, and the decoder then refuses to compute, naming the first released parameter.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "model/decoder.h"

using namespace ktune;
using namespace ktune::model;

namespace {

// A small bf16 Llama and one batch of 2 rows of 5 tokens.
struct SmallRun {
  Decoder decoder{ModelConfig::llama_like(/*vocab*/ 53, /*hidden*/ 32, /*layers*/ 2, /*heads*/ 4, /*kv_heads*/ 2,
                                          /*intermediate*/ 48),
                  /*seed*/ 5, DType::BF16};
  std::vector<int32_t> tokens = {1, 7, 9, 3, 2, 4, 8, 6, 5, 11};
  std::vector<int32_t> labels = {7, 9, 3, 2, -100, 8, 6, 5, 11, 12};
  Batch batch() const { return {tokens.data(), labels.data(), nullptr, nullptr, 2, 5}; }
};

int64_t gradient_bytes(Decoder& d) {
  int64_t bytes = 0;
  for (const Parameter* p : d.parameters()) bytes += p->grad.defined() ? int64_t(p->grad.bytes()) : 0;
  return bytes;
}

// Expects `call` to throw a ktune::Error whose message contains `expected`.
#define EXPECT_ERROR_CONTAINING(call, expected)                                                     \
  try {                                                                                             \
    call;                                                                                           \
    ADD_FAILURE() << #call << " did not throw";                                                     \
  } catch (const Error& e) {                                                                        \
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();                 \
  }

}  // namespace

TEST(DecoderHostMemory, WithoutHostGradientsNoneIsAllocatedAndABackwardIsRefused) {
  SmallRun run;
  run.decoder.set_trainable([](const std::string&) { return true; });
  ASSERT_GT(gradient_bytes(run.decoder), 0);
  run.decoder.set_host_gradients(false);
  EXPECT_EQ(gradient_bytes(run.decoder), 0);
  run.decoder.set_trainable([](const std::string&) { return true; });  // marking what trains allocates none
  EXPECT_EQ(gradient_bytes(run.decoder), 0);
  const LossResult loss = run.decoder.forward_loss(run.batch());  // the forward needs no gradient
  EXPECT_EQ(loss.n_valid, 9);
  EXPECT_ERROR_CONTAINING(run.decoder.forward_backward(run.batch(), 1.0f), "keeps no host gradients");
  EXPECT_EQ(gradient_bytes(run.decoder), 0);
  run.decoder.set_host_gradients(true);  // and back: bf16 gradients for every trainable parameter
  int64_t expected = 0;
  for (const Parameter* p : run.decoder.parameters()) expected += int64_t(p->value.bytes());
  EXPECT_EQ(gradient_bytes(run.decoder), expected);
  EXPECT_EQ(run.decoder.forward_backward(run.batch(), 1.0f).n_valid, 9);
}

TEST(DecoderHostMemory, ReleasedValuesAreFreedAndTheDecoderRefusesToComputeNamingTheFirst) {
  SmallRun run;
  run.decoder.release_values([](const Parameter& p) { return p.name.find("mlp") != std::string::npos; });
  int released = 0;
  for (const Parameter* p : run.decoder.parameters()) {
    const bool mlp = p->name.find("mlp") != std::string::npos;
    EXPECT_EQ(p->value.defined(), !mlp) << p->name;
    released += mlp;
  }
  EXPECT_EQ(released, 6);  // gate, up, down in each of the 2 layers
  EXPECT_ERROR_CONTAINING(run.decoder.forward_loss(run.batch()),
                          "the value of model.layers.0.mlp.gate_proj.weight was released");
}
