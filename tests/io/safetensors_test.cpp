// safetensors: round trips (every dtype core has, metadata, sharding with the HF index) and every
// kind of bad file the reader must refuse with an Error naming the file and the tensor.
#include "io/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace fs = std::filesystem;
using namespace ktune;
using namespace ktune::io;

namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ktune_st_" + std::to_string(getpid()) + "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  // A file with exactly this header text (unpadded) and data bytes.
  std::string write_raw(const std::string& name, const std::string& header, const std::string& data,
                        int64_t claimed_len = -1) {
    std::string path = file(name);
    std::ofstream out(path, std::ios::binary);
    uint64_t len = claimed_len >= 0 ? uint64_t(claimed_len) : header.size();
    for (int i = 0; i < 8; ++i) out.put(char((len >> (8 * i)) & 0xff));
    out << header << data;
    return path;
  }

  // Expect open (and then view of tensor, if given) to throw an Error whose message names all of parts.
  void expect_error(const std::string& path, std::vector<std::string> parts, const std::string& tensor = "") {
    try {
      SafetensorsFile f = SafetensorsFile::open(path);
      if (!tensor.empty()) f.view(tensor);
      FAIL() << "no error for " << path;
    } catch (const Error& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << msg;
      for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
    }
  }

  fs::path dir_;
};

Tensor iota_f32(Shape shape, float start = 0.5f) {
  Tensor t = Tensor::empty(shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = start + 0.25f * float(i);
  return t;
}

TEST_F(SafetensorsTest, RoundTripKeepsEveryDtypeShapeAndMetadata) {
  Tensor a = iota_f32({3, 4});
  Tensor b = a.to(DType::BF16);
  Tensor c = Tensor::empty({5}, DType::I64);
  for (int i = 0; i < 5; ++i) c.data<int64_t>()[i] = -7 + i * 1000000000000ll;
  Tensor d = Tensor::empty({2, 1, 3}, DType::I32);
  for (int i = 0; i < 6; ++i) d.data<int32_t>()[i] = i * 3 - 4;
  Tensor e = Tensor::empty({0, 4});  // empty tensors are legal
  write_safetensors(file("x.safetensors"), {{"a", a}, {"b.weight", b}, {"c", c}, {"d", d}, {"e", e}},
                    {{"format", "pt"}});
  SafetensorsFile f = SafetensorsFile::open(file("x.safetensors"));
  EXPECT_EQ(f.names().size(), 5u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  Tensor a2 = f.view("a");
  ASSERT_EQ(a2.dtype(), DType::F32);
  ASSERT_EQ(a2.shape(), Shape({3, 4}));
  EXPECT_EQ(std::memcmp(a2.raw(), a.raw(), a.bytes()), 0);
  Tensor b2 = f.view("b.weight");
  ASSERT_EQ(b2.dtype(), DType::BF16);
  EXPECT_EQ(std::memcmp(b2.raw(), b.raw(), b.bytes()), 0);
  Tensor b32 = f.to_f32("b.weight");
  ASSERT_EQ(b32.dtype(), DType::F32);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(b32.f32()[i], bf16_to_f32(b.bf16()[i]));
  EXPECT_EQ(std::memcmp(f.view("c").raw(), c.raw(), c.bytes()), 0);
  EXPECT_EQ(f.view("d").shape(), Shape({2, 1, 3}));
  EXPECT_EQ(std::memcmp(f.view("d").raw(), d.raw(), d.bytes()), 0);
  EXPECT_EQ(f.view("e").numel(), 0);
  // The header is padded to 8 bytes, as the format asks.
  std::ifstream in(file("x.safetensors"), std::ios::binary);
  uint64_t len = 0;
  in.read(reinterpret_cast<char*>(&len), 8);
  EXPECT_EQ(len % 8, 0u);
}

TEST_F(SafetensorsTest, ViewOutlivesTheFileObject) {
  write_safetensors(file("x.safetensors"), {{"a", iota_f32({64})}});
  Tensor v;
  {
    SafetensorsFile f = SafetensorsFile::open(file("x.safetensors"));
    v = f.view("a");
  }
  EXPECT_EQ(v.f32()[63], 0.5f + 0.25f * 63);
}

TEST_F(SafetensorsTest, F16ConvertsToF32) {
  // 1.0 = 0x3c00, -2.0 = 0xc000, 0.5 = 0x3800 in IEEE half.
  std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}})";
  std::string data("\x00\x3c\x00\xc0\x00\x38", 6);
  SafetensorsFile f = SafetensorsFile::open(write_raw("h.safetensors", header, data));
  Tensor t = f.to_f32("h");
  EXPECT_EQ(t.f32()[0], 1.0f);
  EXPECT_EQ(t.f32()[1], -2.0f);
  EXPECT_EQ(t.f32()[2], 0.5f);
}

TEST_F(SafetensorsTest, MisalignedDataIsCopiedNotReadUnaligned) {
  // Header of 3 bytes of padding-free JSON is impossible; instead put a 1-byte U8 tensor first.
  std::string header = R"({"u":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');
  float one = 1.5f;
  std::string data(1, '\x07');
  data.append(reinterpret_cast<const char*>(&one), 4);
  SafetensorsFile f = SafetensorsFile::open(write_raw("m.safetensors", header, data));
  Tensor t = f.view("f");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 4, 0u);
  EXPECT_EQ(t.f32()[0], 1.5f);
  EXPECT_EQ(f.view("u").data<uint8_t>()[0], 7);
}

TEST_F(SafetensorsTest, ShardedWriteProducesHfNamesAndAnIndexTheCheckpointReads) {
  std::vector<NamedTensor> ts;
  for (int i = 0; i < 5; ++i) ts.push_back({"layer." + std::to_string(i) + ".weight", iota_f32({10, 10}, float(i))});
  // 400 bytes each; 900-byte shards hold two -> three shards.
  auto written = write_safetensors_sharded(dir_.string(), ts, 900, {{"format", "pt"}});
  ASSERT_EQ(written.size(), 4u);
  EXPECT_EQ(written[0], "model-00001-of-00003.safetensors");
  EXPECT_EQ(written[2], "model-00003-of-00003.safetensors");
  EXPECT_EQ(written[3], "model.safetensors.index.json");
  std::ifstream in(file("model.safetensors.index.json"));
  nlohmann::json index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"].get<int64_t>(), 2000);
  EXPECT_EQ(index["weight_map"]["layer.4.weight"], "model-00003-of-00003.safetensors");
  for (const std::string& open_path : {dir_.string(), file("model.safetensors.index.json")}) {
    SafetensorsCheckpoint c = SafetensorsCheckpoint::open(open_path);
    EXPECT_EQ(c.num_files(), 3u);
    ASSERT_EQ(c.names().size(), 5u);
    for (int i = 0; i < 5; ++i) {
      Tensor t = c.to_f32("layer." + std::to_string(i) + ".weight");
      EXPECT_EQ(t.f32()[99], float(i) + 0.25f * 99);
    }
  }
  // No temp files are left behind.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
}

TEST_F(SafetensorsTest, ShardedWriteThatFitsIsOneFileWithoutIndex) {
  auto written = write_safetensors_sharded(dir_.string(), {{"a", iota_f32({4})}}, 1 << 20);
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0], "model.safetensors");
  EXPECT_FALSE(fs::exists(file("model.safetensors.index.json")));
  EXPECT_TRUE(SafetensorsCheckpoint::open(dir_.string()).contains("a"));
}

TEST_F(SafetensorsTest, OverwriteIsAtomicReplacement) {
  write_safetensors(file("x.safetensors"), {{"a", iota_f32({4})}});
  write_safetensors(file("x.safetensors"), {{"b", iota_f32({2})}});
  SafetensorsFile f = SafetensorsFile::open(file("x.safetensors"));
  EXPECT_FALSE(f.contains("a"));
  EXPECT_TRUE(f.contains("b"));
}

TEST_F(SafetensorsTest, WriterRefusesDuplicateNames) {
  EXPECT_THROW(write_safetensors(file("x.safetensors"), {{"a", iota_f32({4})}, {"a", iota_f32({4})}}), Error);
  EXPECT_FALSE(fs::exists(file("x.safetensors")));
}

// The streamed writer makes each tensor as it reaches it and drops it before making the next (each
// produced tensor's storage counts itself freed), and writes the file write_safetensors writes.
TEST_F(SafetensorsTest, StreamedWriteHoldsOneProducedTensorAtATimeAndWritesTheSameFile) {
  const std::vector<NamedTensor> tensors = {{"a", iota_f32({3, 4})}, {"b", iota_f32({5}, 2.0f).to(DType::BF16)},
                                            {"c", iota_f32({2, 2, 2}, -1.0f)}};
  write_safetensors(file("whole.safetensors"), tensors, {{"format", "pt"}});
  auto freed = std::make_shared<int>(0);
  std::vector<int> freed_when_produced;
  std::vector<PlannedTensor> planned;
  for (const NamedTensor& t : tensors)
    planned.push_back({t.name, t.tensor.dtype(), t.tensor.shape(), [&, t, freed] {
                         freed_when_produced.push_back(*freed);
                         Tensor copy = t.tensor.clone();
                         std::shared_ptr<void> counted(nullptr, [copy, freed](void*) { ++*freed; });
                         return Tensor::view(copy.raw(), copy.shape(), copy.dtype(), counted);
                       }});
  write_safetensors_streamed(file("streamed.safetensors"), planned, {{"format", "pt"}});
  EXPECT_EQ(freed_when_produced, (std::vector<int>{0, 1, 2}));  // each made once the one before was freed
  EXPECT_EQ(*freed, 3);
  std::ifstream whole(file("whole.safetensors"), std::ios::binary), streamed(file("streamed.safetensors"), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(whole), {}), std::string(std::istreambuf_iterator<char>(streamed), {}));
}

TEST_F(SafetensorsTest, StreamedWriteRefusesATensorProducedOtherThanPlannedAndLeavesNoFile) {
  std::vector<PlannedTensor> planned = {{"a", DType::F32, Shape{4}, [] { return iota_f32({4}); }},
                                        {"b", DType::F32, Shape{2, 3}, [] { return iota_f32({3, 2}); }}};
  try {
    write_safetensors_streamed(file("x.safetensors"), planned);
    FAIL() << "a tensor of another shape than planned was written";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tensor b"), std::string::npos) << msg;
    EXPECT_NE(msg.find("f32(3, 2)"), std::string::npos) << msg;
  }
  EXPECT_TRUE(fs::is_empty(dir_)) << "the file or its temporary was left behind";
}

// The writer by position takes the tensors in any order and writes the file write_safetensors
// writes for the planned order, byte for byte.
TEST_F(SafetensorsTest, WriterByPositionTakesTensorsInAnyOrderAndWritesThePlannedFile) {
  const std::vector<NamedTensor> tensors = {{"a", iota_f32({3, 4})}, {"b", iota_f32({5}, 2.0f).to(DType::BF16)},
                                            {"c", iota_f32({2, 2, 2}, -1.0f)}, {"empty", iota_f32({0, 3})}};
  write_safetensors(file("whole.safetensors"), tensors, {{"format", "pt"}});
  std::vector<TensorSpec> specs;
  for (const NamedTensor& t : tensors) specs.push_back({t.name, t.tensor.dtype(), t.tensor.shape()});
  SafetensorsWriter writer(file("by_position.safetensors"), specs, {{"format", "pt"}});
  EXPECT_TRUE(writer.holds("b"));
  EXPECT_FALSE(writer.holds("d"));
  for (int i : {2, 0, 3, 1}) writer.write(tensors[size_t(i)].name, tensors[size_t(i)].tensor);
  EXPECT_FALSE(fs::exists(file("by_position.safetensors"))) << "in place before commit()";
  writer.commit();
  std::ifstream whole(file("whole.safetensors"), std::ios::binary), placed(file("by_position.safetensors"), std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(whole), {}), std::string(std::istreambuf_iterator<char>(placed), {}));
}

// What the writer refuses names the file and the tensor; a writer never committed leaves nothing
// behind (an older file at the path untouched), nor does a commit with a tensor missing.
TEST_F(SafetensorsTest, WriterByPositionRefusesWhatWasNotPlannedOrTwiceAndLeavesNoFileUncommitted) {
  write_safetensors(file("x.safetensors"), {{"old", iota_f32({2})}});
  const std::vector<TensorSpec> specs = {{"a", DType::F32, Shape{4}}, {"b", DType::BF16, Shape{2, 3}}};
  auto message = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  {
    SafetensorsWriter writer(file("x.safetensors"), specs);
    writer.write("a", iota_f32({4}));
    const std::string twice = message([&] { writer.write("a", iota_f32({4})); });
    EXPECT_NE(twice.find("x.safetensors: tensor a"), std::string::npos) << twice;
    EXPECT_NE(twice.find("written twice"), std::string::npos) << twice;
    const std::string unplanned = message([&] { writer.write("c", iota_f32({4})); });
    EXPECT_NE(unplanned.find("tensor c"), std::string::npos) << unplanned;
    EXPECT_NE(unplanned.find("not planned"), std::string::npos) << unplanned;
    const std::string other = message([&] { writer.write("b", iota_f32({2, 3})); });
    EXPECT_NE(other.find("given f32(2, 3), planned bf16(2, 3)"), std::string::npos) << other;
    const std::string missing = message([&] { writer.commit(); });
    EXPECT_NE(missing.find("tensor b"), std::string::npos) << missing;
    EXPECT_NE(missing.find("never written"), std::string::npos) << missing;
  }
  {
    SafetensorsWriter abandoned(file("x.safetensors"), specs);
    abandoned.write("a", iota_f32({4}));
  }
  SafetensorsFile f = SafetensorsFile::open(file("x.safetensors"));
  EXPECT_TRUE(f.contains("old")) << "an uncommitted writer replaced the file";
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u) << "a temporary file was left behind";
}

// --- bad files -----------------------------------------------------------------------------------

TEST_F(SafetensorsTest, MissingTensorNamesFileAndTensor) {
  write_safetensors(file("x.safetensors"), {{"a", iota_f32({4})}});
  expect_error(file("x.safetensors"), {"model.norm.weight", "not found"}, "model.norm.weight");
}

TEST_F(SafetensorsTest, FileShorterThanHeaderLengthIsTruncated) {
  expect_error(write_raw("t.safetensors", "", "", 0).substr(0), {}, "");  // 8-byte header, empty JSON: invalid
  std::string p = file("tiny.safetensors");
  std::ofstream(p, std::ios::binary) << "abc";
  expect_error(p, {"truncated"});
}

TEST_F(SafetensorsTest, HeaderLongerThanFileIsTruncated) {
  std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  expect_error(write_raw("t.safetensors", header, "", int64_t(header.size()) + 100), {"truncated"});
}

TEST_F(SafetensorsTest, DataCutShortIsOutOfBounds) {
  write_safetensors(file("x.safetensors"), {{"a", iota_f32({4})}, {"w", iota_f32({16})}});
  fs::resize_file(file("x.safetensors"), fs::file_size(file("x.safetensors")) - 3);
  expect_error(file("x.safetensors"), {"tensor w", "out of bounds"});
}

TEST_F(SafetensorsTest, CorruptJsonIsRefused) {
  expect_error(write_raw("c.safetensors", R"({"a":{"dtype":"F32",)", "xxxx"), {"not valid JSON"});
  expect_error(write_raw("c2.safetensors", R"([1,2])", ""), {"not a JSON object"});
  expect_error(write_raw("c3.safetensors", R"({"a":{"dtype":"F32","shape":[1]}})", "xxxx"), {"tensor a", "data_offsets"});
  expect_error(write_raw("c4.safetensors", R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"),
               {"tensor a", "shape"});
  expect_error(write_raw("c5.safetensors", R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "xxxx"),
               {"tensor a", "data_offsets"});
  expect_error(write_raw("c6.safetensors", R"({"__metadata__":{"k":1}})", ""), {"__metadata__"});
}

TEST_F(SafetensorsTest, OffsetsOutOfBoundsAreRefused) {
  std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[1000,1008]}})";
  expect_error(write_raw("o.safetensors", header, std::string(8, '\0')), {"tensor a", "out of bounds"});
  // An end offset near 2^64 must not wrap around.
  header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[18446744073709551615,18446744073709551615]}})";
  expect_error(write_raw("o2.safetensors", header, std::string(8, '\0')), {"tensor a", "out of bounds"});
}

TEST_F(SafetensorsTest, OverlappingTensorsAreRefused) {
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_error(write_raw("ov.safetensors", header, std::string(12, '\0')), {"tensor b", "overlaps tensor a"});
}

// The tensors must tile the data buffer as HF's reader requires ("file not fully covered"): a gap
// between two tensors, or bytes after the last (a file appended to), are refused naming where.
TEST_F(SafetensorsTest, BytesNoTensorCoversAreRefused) {
  std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})";
  expect_error(write_raw("gap.safetensors", header, std::string(16, '\0')),
               {"tensor b", "leaving 4 bytes no tensor covers after tensor a"});
  header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_error(write_raw("tail.safetensors", header, std::string(24, '\0')),
               {"tail.safetensors", "holds 16 bytes after the last tensor's data"});
  header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})";
  expect_error(write_raw("front.safetensors", header, std::string(12, '\0')), {"tensor a", "at its start"});
}

TEST_F(SafetensorsTest, SizeThatDisagreesWithShapeIsRefused) {
  std::string header = R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})";
  expect_error(write_raw("s.safetensors", header, std::string(8, '\0')), {"tensor a", "needs 12"});
  // numel * 4 overflowing 64 bits must not wrap to the stored size.
  header = R"({"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
  expect_error(write_raw("s2.safetensors", header, ""), {"tensor a"});
}

TEST_F(SafetensorsTest, UnknownDtypeIsRefusedAtOpen) {
  std::string header = R"({"a":{"dtype":"Q4_K","shape":[2],"data_offsets":[0,2]}})";
  expect_error(write_raw("d.safetensors", header, std::string(2, '\0')), {"tensor a", "unknown dtype 'Q4_K'"});
}

TEST_F(SafetensorsTest, KnownButUnsupportedDtypeIsRefusedOnUse) {
  std::string header = R"({"a":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})";
  std::string p = write_raw("d.safetensors", header, std::string(8, '\0'));
  SafetensorsFile f = SafetensorsFile::open(p);  // the header itself is fine
  expect_error(p, {"tensor a", "F64", "not supported"}, "a");
  EXPECT_THROW(f.to_f32("a"), Error);
}

TEST_F(SafetensorsTest, IndexNamingAMissingShardOrTensorIsRefused) {
  write_safetensors(file("model-00001-of-00001.safetensors"), {{"a", iota_f32({4})}});
  std::ofstream(file("model.safetensors.index.json"))
      << R"({"metadata":{},"weight_map":{"a":"model-00001-of-00001.safetensors","b":"model-00001-of-00001.safetensors"}})";
  try {
    SafetensorsCheckpoint::open(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor b"), std::string::npos) << e.what();
  }
  std::ofstream(file("model.safetensors.index.json"), std::ios::trunc)
      << R"({"weight_map":{"a":"model-00002-of-00002.safetensors"}})";
  try {
    SafetensorsCheckpoint::open(dir_.string());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model-00002-of-00002.safetensors"), std::string::npos) << e.what();
  }
  std::ofstream(file("model.safetensors.index.json"), std::ios::trunc) << R"({"weight_map":{"a":"../etc/passwd"}})";
  EXPECT_THROW(SafetensorsCheckpoint::open(dir_.string()), Error);
  std::ofstream(file("model.safetensors.index.json"), std::ios::trunc) << "{not json";
  EXPECT_THROW(SafetensorsCheckpoint::open(dir_.string()), Error);
}

TEST_F(SafetensorsTest, MissingFileIsAnError) {
  expect_error(file("nope.safetensors"), {"cannot open"});
}

}  // namespace
