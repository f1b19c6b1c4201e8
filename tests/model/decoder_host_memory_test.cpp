// What a decoder whose steps run elsewhere (the GPU step) keeps on the host: set_host_gradients(false)
// frees every gradient, allocates none later and refuses a backward; release_values frees the
// values it selects, and the decoder then refuses to compute, naming the first released parameter;
// values loaded as views of the checkpoint's mapping (LoadOptions::map_values) are counted as such
// until released or replaced, and their pages dropped without changing what they read.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
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

TEST(DecoderHostMemory, MappedValuesAreCountedUntilReleasedOrReplacedAndDroppingTheirPagesKeepsTheirValues) {
  const std::string fixture = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/llama";  // f32 values
  std::unique_ptr<Decoder> copied = Decoder::from_pretrained(fixture);
  LoadOptions options;
  options.map_values = true;  // storage f32, as the file holds them: every value a view of the file
  std::unique_ptr<Decoder> mapped = Decoder::from_pretrained(fixture, options);
  EXPECT_EQ(copied->mapped_value_bytes(), 0);
  int64_t all_bytes = 0;
  for (const Parameter* p : mapped->parameters()) {
    EXPECT_TRUE(mapped->value_is_mapped(*p)) << p->name;
    EXPECT_FALSE(copied->value_is_mapped(copied->parameter(p->name))) << p->name;
    all_bytes += int64_t(p->value.bytes());
  }
  EXPECT_EQ(mapped->mapped_value_bytes(), all_bytes);

  // One value released, one replaced by a copy of itself: neither is the file's any more.
  const std::string released = "model.layers.0.mlp.up_proj.weight", replaced = "model.layers.1.self_attn.q_proj.weight";
  Parameter& replaced_p = mapped->parameter(replaced);
  const int64_t released_bytes = int64_t(mapped->parameter(released).value.bytes());
  const int64_t replaced_bytes = int64_t(replaced_p.value.bytes());
  replaced_p.value = replaced_p.value.clone();
  mapped->release_values([&](const Parameter& p) { return p.name == released; });
  EXPECT_FALSE(mapped->value_is_mapped(replaced_p));
  EXPECT_EQ(mapped->mapped_value_bytes(), all_bytes - released_bytes - replaced_bytes);

  EXPECT_EQ(mapped->drop_mapped_pages(), all_bytes - released_bytes - replaced_bytes);
  for (Parameter* p : copied->parameters()) {  // read again from the file: the loaded values, the copy's too
    if (p->name == released) continue;
    const Tensor& value = mapped->parameter(p->name).value;
    EXPECT_EQ(std::memcmp(value.raw(), p->value.raw(), p->value.bytes()), 0) << p->name;
  }
  EXPECT_EQ(mapped->mapped_value_bytes(), all_bytes - released_bytes - replaced_bytes);
}
