// What a decoder whose steps run elsewhere (the GPU step) keeps on the host: set_host_gradients(false)
// frees every gradient, allocates none later and refuses a backward; release_values frees the
// values it selects, and the decoder then refuses to compute, naming the first released parameter;
// values loaded as views of the checkpoint's mapping (LoadOptions::map_values) are counted as such
// until released or replaced, and their pages dropped without changing what they read; a file in
// another dtype than the storage's is mapped as it is and read rounded to the storage dtype.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
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

// Every value of the model in `dir` loaded as `storage` both ways: copied (`copied`: no stored
// dtype, the storage's) and mapped (`mapped`: held in `file_dtype`, stored as `storage`), where
// stored_value gives the copy's bits and read_stored_f32 a chunk of them widened. Returns the
// bytes the mapped values hold.
int64_t expect_mapped_reads_as_copied(Decoder& copied, Decoder& mapped, DType file_dtype, DType storage) {
  int64_t held = 0;
  for (const Parameter* p : copied.parameters()) {
    const Parameter& m = mapped.parameter(p->name);
    EXPECT_EQ(p->value.dtype(), storage) << p->name;
    EXPECT_FALSE(p->stored_dtype.has_value()) << p->name;
    EXPECT_TRUE(mapped.value_is_mapped(m)) << p->name;
    EXPECT_EQ(m.value.dtype(), file_dtype) << p->name;
    EXPECT_EQ(stored_dtype_of(m), storage) << p->name;
    held += int64_t(m.value.bytes());
    const Tensor stored = stored_value(m);
    EXPECT_EQ(stored.dtype(), storage) << p->name;
    if (stored.dtype() != storage) continue;
    EXPECT_EQ(std::memcmp(stored.raw(), p->value.raw(), p->value.bytes()), 0) << p->name;
    // A chunk in the middle, as QLoRA's quantiser reads it.
    const int64_t first = p->value.numel() / 3, count = p->value.numel() / 2;
    std::vector<float> got(static_cast<size_t>(count)), want(static_cast<size_t>(count));
    read_stored_f32(m, first, count, got.data());
    for (int64_t i = 0; i < count; ++i)
      want[size_t(i)] = storage == DType::BF16 ? bf16_to_f32(p->value.bf16()[first + i]) : p->value.f32()[first + i];
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << p->name;
  }
  return held;
}

// Gemma 2's checkpoints hold f32, some others f16; a GPU run keeps bf16. Mapped, each value is a
// view of the file (not a bf16 copy on every rank) that reads as the bf16 copy would hold it:
// stored_value and read_stored_f32 give the copied model's bits (an f16 file under f32 storage too:
// widened exactly); the decoder refuses to compute on it, naming the first such parameter, until
// every such value is replaced by one in the storage dtype.
TEST(DecoderHostMemory, AFileInAnotherDtypeIsMappedAsItIsAndReadAsTheStorageCopyWould) {
  const std::string fixture = std::string(KTUNE_SOURCE_DIR) + "/tests/model/fixtures/llama";  // f32 values
  LoadOptions bf16_copy;
  bf16_copy.storage = DType::BF16;
  LoadOptions bf16_mapped = bf16_copy;
  bf16_mapped.map_values = true;
  std::unique_ptr<Decoder> copied = Decoder::from_pretrained(fixture, bf16_copy);
  std::unique_ptr<Decoder> mapped = Decoder::from_pretrained(fixture, bf16_mapped);
  const int64_t f32_bytes = expect_mapped_reads_as_copied(*copied, *mapped, DType::F32, DType::BF16);
  EXPECT_EQ(mapped->mapped_value_bytes(), f32_bytes);
  std::vector<int32_t> tokens = {1, 7, 9, 3}, labels = {7, 9, 3, 2};
  EXPECT_ERROR_CONTAINING(mapped->forward_loss({tokens.data(), labels.data(), nullptr, nullptr, 1, 4}),
                          "the value of model.embed_tokens.weight is mapped in its checkpoint file's dtype, not bf16");
  const LossResult copied_loss = copied->forward_loss({tokens.data(), labels.data(), nullptr, nullptr, 1, 4});
  // Each value replaced by its stored copy (as sharded data parallelism's gathers replace them): the
  // decoder computes, the copied model's loss.
  for (Parameter* p : mapped->parameters()) p->value = stored_value(*p);
  EXPECT_EQ(mapped->forward_loss({tokens.data(), labels.data(), nullptr, nullptr, 1, 4}).loss_sum, copied_loss.loss_sum);

  // The fixture in f16 (its values rounded to ten mantissa bits): mapped as f16, read as the bf16
  // copy (one rounding of the exact widening) and as the f32 copy (the widening) would hold it.
  const std::filesystem::path f16_dir =
      std::filesystem::temp_directory_path() / ("ktune_f16_model_" + std::to_string(getpid()));
  std::filesystem::create_directories(f16_dir);
  std::filesystem::copy_file(fixture + "/config.json", f16_dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  io::SafetensorsFile f32_file = io::SafetensorsFile::open(fixture + "/model.safetensors");
  std::vector<io::NamedTensor> halves;
  int64_t rounded_by_bf16 = 0;  // values whose f16 -> bf16 rounding changes them: the reading is tested
  for (const std::string& name : f32_file.names()) {
    const Tensor half = f32_file.to_f32(name).to(DType::F16);
    const uint16_t* h = static_cast<const uint16_t*>(half.raw());
    for (int64_t i = 0; i < half.numel(); ++i)
      rounded_by_bf16 += bf16_to_f32(f32_to_bf16(f16_to_f32(h[i]))) != f16_to_f32(h[i]);
    halves.push_back({name, half});
  }
  ASSERT_GT(rounded_by_bf16, 0);
  io::write_safetensors((f16_dir / "model.safetensors").string(), halves, {{"format", "pt"}});
  LoadOptions f32_copy, f32_mapped;
  f32_mapped.map_values = true;
  std::unique_ptr<Decoder> f16_copied = Decoder::from_pretrained(f16_dir.string(), bf16_copy);
  std::unique_ptr<Decoder> f16_mapped = Decoder::from_pretrained(f16_dir.string(), bf16_mapped);
  std::unique_ptr<Decoder> f16_widened = Decoder::from_pretrained(f16_dir.string(), f32_copy);
  std::unique_ptr<Decoder> f16_mapped_f32 = Decoder::from_pretrained(f16_dir.string(), f32_mapped);
  std::filesystem::remove_all(f16_dir);
  const int64_t f16_bytes = expect_mapped_reads_as_copied(*f16_copied, *f16_mapped, DType::F16, DType::BF16);
  EXPECT_EQ(f16_bytes, f32_bytes / 2);
  EXPECT_EQ(f16_mapped->mapped_value_bytes(), f16_bytes);
  EXPECT_EQ(expect_mapped_reads_as_copied(*f16_widened, *f16_mapped_f32, DType::F16, DType::F32), f16_bytes);
  EXPECT_ERROR_CONTAINING(f16_mapped_f32->forward_loss({tokens.data(), labels.data(), nullptr, nullptr, 1, 4}),
                          "is mapped in its checkpoint file's dtype, not f32");
}
