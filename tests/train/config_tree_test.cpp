// The config tree: YAML loading with OmegaConf's scalar typing, paths, and the YAML writer.
#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "train/config.h"

using ktune::train::ConfigNode;
using ktune::train::load_config_yaml;
using ktune::train::type_plain_scalar;

TEST(ConfigTree, PlainScalarsAreTypedAsOmegaConfTypesThem) {
  EXPECT_TRUE(type_plain_scalar("True").as_bool());
  EXPECT_FALSE(type_plain_scalar("off").as_bool());
  EXPECT_TRUE(type_plain_scalar("null").is_null());
  EXPECT_TRUE(type_plain_scalar("").is_null());
  EXPECT_DOUBLE_EQ(type_plain_scalar("3e-4").as_float(), 3e-4);
  EXPECT_TRUE(type_plain_scalar("3e-4").is_float());
  EXPECT_EQ(type_plain_scalar("00030").as_int(), 24);  // YAML 1.1 octal, why torchtune quotes "00030"
  EXPECT_EQ(type_plain_scalar("0x1F").as_int(), 31);
  EXPECT_EQ(type_plain_scalar("1_000").as_int(), 1000);
  EXPECT_EQ(type_plain_scalar("-5").as_int(), -5);
  EXPECT_TRUE(type_plain_scalar("inf").is_string());  // only .inf is a float
  EXPECT_TRUE(std::isinf(type_plain_scalar(".inf").as_float()));
  EXPECT_EQ(type_plain_scalar("bf16").as_string(), "bf16");
  EXPECT_EQ(type_plain_scalar("08").as_string(), "08");
  EXPECT_EQ(type_plain_scalar("99999999999999999999").as_string(), "99999999999999999999");  // beyond int64
}

TEST(ConfigTree, QuotedScalarsStayStrings) {
  ConfigNode t = load_config_yaml("a: \"00030\"\nb: 'True'\nc: 00030\n", "t.yaml");
  EXPECT_EQ(t.find("a")->as_string(), "00030");
  EXPECT_EQ(t.find("b")->as_string(), "True");
  EXPECT_EQ(t.find("c")->as_int(), 24);
}

TEST(ConfigTree, LoadsTorchtuneShapedYamlWithFlowListsAndTrailingCommas) {
  ConfigNode t = load_config_yaml(
      "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
      "  lora_attn_modules: ['q_proj', 'v_proj', 'output_proj']\n"
      "checkpointer:\n  checkpoint_files: [\n     model.safetensors,\n  ]\n"
      "optimizer:\n  lr: 3e-4\n",
      "t.yaml");
  EXPECT_TRUE(t.find("model")->is_component());
  EXPECT_EQ(t.find("model")->component(), "torchtune.models.llama3_2.lora_llama3_2_1b");
  ASSERT_EQ(t.find_path("model.lora_attn_modules")->items().size(), 3u);
  EXPECT_EQ(t.find_path("model.lora_attn_modules.2")->as_string(), "output_proj");
  ASSERT_EQ(t.find_path("checkpointer.checkpoint_files")->items().size(), 1u);
  EXPECT_DOUBLE_EQ(t.find_path("optimizer.lr")->as_float(), 3e-4);
  EXPECT_EQ(t.find_path("optimizer.nope"), nullptr);
}

TEST(ConfigTree, SyntaxErrorNamesFileLineAndColumn) {
  try {
    load_config_yaml("a: 1\nb: [1, 2\n", "broken.yaml");
    FAIL() << "expected an error";
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.yaml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("YAML syntax error"), std::string::npos) << e.what();
  }
}

// OmegaConf (torchtune's loader) refuses a key given twice in one mapping; so does ktune, naming
// both places. The same key in two different mappings is two keys.
TEST(ConfigTree, ADuplicateKeyIsRefusedNamingBothLines) {
  try {
    load_config_yaml("epochs: 3\nmax_steps_per_epoch: null\noptimizer:\n  lr: 1e-3\nepochs: 1\n", "dup.yaml");
    FAIL() << "expected an error";
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dup.yaml:5:1: duplicate key 'epochs' (first at dup.yaml:1:1)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(load_config_yaml("optimizer:\n  lr: 1\n  lr: 2\n", "nested.yaml"), ktune::Error);
  const ConfigNode t = load_config_yaml("a:\n  lr: 1\nb:\n  lr: 2\n", "apart.yaml");
  EXPECT_EQ(t.find_path("b.lr")->as_int(), 2);
}

TEST(ConfigTree, NonMappingDocumentIsRefused) {
  EXPECT_THROW(load_config_yaml("- a\n- b\n", "list.yaml"), ktune::Error);
  EXPECT_TRUE(load_config_yaml("", "empty.yaml").is_map());
}

TEST(ConfigTree, WrittenYamlReadsBackToTheSameTree) {
  const char* text =
      "output_dir: /tmp/x\n"
      "s1: '00030'\ns2: 'True'\ns3: 'a: b'\ns4: '#x'\ns5: ''\ns6: \"tab\\there\"\ns7: ${output_dir}/logs\n"
      "f: 3e-4\ng: 2.0\nh: .inf\ni: -7\nb: false\nn: null\n"
      "l: [a, 'b, c', 1, 2.5, null]\n"
      "m:\n  _component_: x.y\n  nested: {k: v, e: {}}\n  ll: [[1, 2], {a: 1}]\n"
      "lm:\n  - a: 1\n    b: 2\n  - c: 3\n"
      "empty_list: []\n";
  ConfigNode t = load_config_yaml(text, "t.yaml");
  std::string written = t.to_yaml();
  ConfigNode again = load_config_yaml(written, "written.yaml");
  EXPECT_EQ(t, again) << written;
  EXPECT_TRUE(again.find("s1")->is_string());
  EXPECT_TRUE(again.find("g")->is_float());
}

TEST(ConfigTree, MapsKeepFileOrderAndSetReplacesInPlace) {
  ConfigNode t = load_config_yaml("z: 1\na: 2\nm: 3\n", "t.yaml");
  t.set("a", ConfigNode::string("x"));
  t.set("new", ConfigNode::integer(4));
  std::vector<std::string> keys;
  for (const auto& e : t.entries()) keys.push_back(e.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"z", "a", "m", "new"}));
  EXPECT_TRUE(t.erase("m"));
  EXPECT_FALSE(t.erase("m"));
}

TEST(ConfigTree, AccessorOfTheWrongKindNamesWhatItFound) {
  ConfigNode n = ConfigNode::string("abc");
  try {
    n.as_int();
    FAIL();
  } catch (const ktune::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected an int, got string abc"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(ConfigNode::integer(3).as_float(), 3.0);
}
