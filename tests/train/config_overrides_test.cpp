// torchtune's override grammar, case by case, and its error messages.
#include <gtest/gtest.h>

#include "core/error.h"
#include "train/config.h"
#include "train/config_overrides.h"

using ktune::train::apply_overrides;
using ktune::train::ConfigNode;
using ktune::train::load_config_yaml;

namespace {

const char* kBase =
    "output_dir: /tmp/out\n"
    "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_rank: 64\n  lora_alpha: 128\n"
    "dataset:\n  _component_: torchtune.datasets.alpaca_cleaned_dataset\n  packed: False\n"
    "a:\n  b:\n    c: 1\n"
    "n: 3\n";

ConfigNode base() { return load_config_yaml(kBase, "base.yaml"); }

std::string all_messages(const ktune::Errors& e) {
  std::string out;
  for (const auto& x : e.errors()) out += std::string(x.what()) + "\n";
  return out;
}

}  // namespace

TEST(ConfigOverrides, DottedKeySetsNestedValueTypedAsYaml) {
  ConfigNode t = base();
  apply_overrides(t, {"model.lora_rank=8", "a.b.c=x", "new.deep.key=2.5", "n=True"});
  EXPECT_EQ(t.find_path("model.lora_rank")->as_int(), 8);
  EXPECT_EQ(t.find_path("a.b.c")->as_string(), "x");
  EXPECT_DOUBLE_EQ(t.find_path("new.deep.key")->as_float(), 2.5);
  EXPECT_TRUE(t.find("n")->as_bool());
}

TEST(ConfigOverrides, ListValuesInYamlAndPythonSpelling) {
  ConfigNode t = base();
  apply_overrides(t, {"model.lora_attn_modules=[q_proj,v_proj]", "l=['q_proj', 'k_proj']", "e=[]"});
  const auto& items = t.find_path("model.lora_attn_modules")->items();
  ASSERT_EQ(items.size(), 2u);
  EXPECT_EQ(items[0].as_string(), "q_proj");
  EXPECT_EQ(items[1].as_string(), "v_proj");
  EXPECT_EQ(t.find("l")->items()[1].as_string(), "k_proj");
  EXPECT_TRUE(t.find("e")->items().empty());
}

TEST(ConfigOverrides, PythonDictLiteralBecomesAMap) {
  ConfigNode t = base();
  apply_overrides(t, {"dataset.column_map={'input': 'question', 'output': 'answer'}"});
  const ConfigNode* m = t.find_path("dataset.column_map");
  ASSERT_TRUE(m != nullptr && m->is_map());
  EXPECT_EQ(m->find("input")->as_string(), "question");
  EXPECT_EQ(m->find("output")->as_string(), "answer");
}

TEST(ConfigOverrides, PythonNoneTrueFalseAreNullAndBools) {
  ConfigNode t = base();
  apply_overrides(t, {"model.lora_rank=None", "x=True", "y=False", "q='None'"});
  EXPECT_TRUE(t.find_path("model.lora_rank")->is_null());
  EXPECT_TRUE(t.find("x")->as_bool());
  EXPECT_FALSE(t.find("y")->as_bool());
  EXPECT_EQ(t.find("q")->as_string(), "None");
}

TEST(ConfigOverrides, ComponentNameReplacesComponentAndKeepsSiblings) {
  ConfigNode t = base();
  apply_overrides(t, {"model=torchtune.models.llama3_2.lora_llama3_2_3b", "dataset=torchtune.datasets.instruct_dataset"});
  EXPECT_EQ(t.find("model")->component(), "torchtune.models.llama3_2.lora_llama3_2_3b");
  EXPECT_EQ(t.find_path("model.lora_rank")->as_int(), 64);  // kept, as torchtune keeps it
  EXPECT_EQ(t.find("dataset")->component(), "torchtune.datasets.instruct_dataset");
  EXPECT_FALSE(t.find_path("dataset.packed")->as_bool());
}

TEST(ConfigOverrides, UpstreamSdkArgumentListApplies) {
  ConfigNode t = base();
  apply_overrides(t, {"dtype=bf16", "batch_size=2", "epochs=1", "loss=torchtune.modules.loss.CEWithChunkedOutputLoss",
                      "model.lora_rank=8", "model.lora_attn_modules=[q_proj,v_proj]",
                      "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet",
                      "dataset.column_map={'input': 'question'}", "model.apply_lora_to_mlp=True",
                      "output_dir=/workspace/output", "tokenizer.path=/workspace/model/original/tokenizer.model",
                      "checkpointer.checkpoint_dir=/workspace/model"});
  EXPECT_EQ(t.find("dtype")->as_string(), "bf16");
  EXPECT_EQ(t.find("batch_size")->as_int(), 2);
  // `loss` was not a component in the base config: it becomes a string (validation then says so).
  EXPECT_EQ(t.find("loss")->as_string(), "torchtune.modules.loss.CEWithChunkedOutputLoss");
  EXPECT_EQ(t.find_path("dataset.source")->as_string(), "parquet");
  EXPECT_EQ(t.find_path("dataset.column_map.input")->as_string(), "question");
  EXPECT_TRUE(t.find_path("model.apply_lora_to_mlp")->as_bool());
  EXPECT_EQ(t.find_path("tokenizer.path")->as_string(), "/workspace/model/original/tokenizer.model");
  EXPECT_EQ(t.find_path("checkpointer.checkpoint_dir")->as_string(), "/workspace/model");
}

TEST(ConfigOverrides, TildeDeletesAndRemovesEmptiedMaps) {
  ConfigNode t = base();
  apply_overrides(t, {"~model.lora_alpha", "~a.b.c"});
  EXPECT_EQ(t.find_path("model.lora_alpha"), nullptr);
  EXPECT_EQ(t.find("a"), nullptr);  // a.b emptied, then a
}

// torchtune removes every `~key` from the file's config before it merges the `key=value`s: the order
// on the command line does not matter, and a key only the command line adds cannot be removed.
TEST(ConfigOverrides, TildeDeletesFromTheFileBeforeAnyValueIsSet) {
  ConfigNode t = base();
  apply_overrides(t, {"model.lora_rank=5", "~model.lora_rank"});
  EXPECT_EQ(t.find_path("model.lora_rank")->as_int(), 5);
  ConfigNode u = base();
  EXPECT_THROW(apply_overrides(u, {"brand_new=1", "~brand_new"}), ktune::Errors);
}

TEST(ConfigOverrides, DeletingAComponentIsRefused) {
  ConfigNode t = base();
  try {
    apply_overrides(t, {"~model"});
    FAIL();
  } catch (const ktune::Errors& e) {
    EXPECT_NE(all_messages(e).find("removing components"), std::string::npos) << all_messages(e);
  }
  EXPECT_THROW(apply_overrides(t, {"~model._component_"}), ktune::Errors);
}

TEST(ConfigOverrides, DeletingAMissingKeySuggestsTheNearest) {
  ConfigNode t = base();
  try {
    apply_overrides(t, {"~model.lora_rnak"});
    FAIL();
  } catch (const ktune::Errors& e) {
    std::string m = all_messages(e);
    EXPECT_NE(m.find("could not find key `model.lora_rnak`"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean `model.lora_rank`?"), std::string::npos) << m;
  }
}

TEST(ConfigOverrides, ValueMayContainEqualsAndSpaces) {
  ConfigNode t = base();
  apply_overrides(t, {"dataset.new_system_prompt=You are a helpful assistant. 2+2=4", "split=train[:95%]"});
  EXPECT_EQ(t.find_path("dataset.new_system_prompt")->as_string(), "You are a helpful assistant. 2+2=4");
  EXPECT_EQ(t.find("split")->as_string(), "train[:95%]");
}

TEST(ConfigOverrides, EveryBadArgumentIsReportedTogetherAndGoodOnesStillApply) {
  ConfigNode t = base();
  try {
    apply_overrides(t, {"no_equals", "model.lora_rank=16", "n.x=1", "l=[unclosed", "=3"});
    FAIL();
  } catch (const ktune::Errors& e) {
    ASSERT_EQ(e.errors().size(), 4u) << all_messages(e);
    std::string m = all_messages(e);
    EXPECT_NE(m.find("must be in the form key=value"), std::string::npos) << m;
    EXPECT_NE(m.find("`n` is an int, not a mapping"), std::string::npos) << m;
    EXPECT_NE(m.find("cannot parse value `[unclosed`"), std::string::npos) << m;
  }
  EXPECT_EQ(t.find_path("model.lora_rank")->as_int(), 16);
}

TEST(ConfigOverrides, MapValueMergesIntoExistingMap) {
  ConfigNode t = load_config_yaml("d:\n  column_map: {input: a, output: b}\n", "t.yaml");
  apply_overrides(t, {"d.column_map={'input': 'q'}"});
  EXPECT_EQ(t.find_path("d.column_map.input")->as_string(), "q");
  EXPECT_EQ(t.find_path("d.column_map.output")->as_string(), "b");
}

TEST(ConfigOverrides, NestedComponentIsReplacedByName) {
  ConfigNode t = load_config_yaml("outer:\n  inner:\n    _component_: a.b\n    k: 1\n", "t.yaml");
  apply_overrides(t, {"outer.inner=c.d"});
  EXPECT_EQ(t.find_path("outer.inner")->component(), "c.d");
  EXPECT_EQ(t.find_path("outer.inner.k")->as_int(), 1);
}

TEST(ConfigOverrides, ListElementsCanBeSetByIndex) {
  ConfigNode t = load_config_yaml("l: [a, b]\nds:\n  - _component_: x\n    packed: false\n", "t.yaml");
  apply_overrides(t, {"l.1=z", "ds.0.packed=True"});
  EXPECT_EQ(t.find_path("l.1")->as_string(), "z");
  EXPECT_TRUE(t.find_path("ds.0.packed")->as_bool());
  EXPECT_THROW(apply_overrides(t, {"l.5=z"}), ktune::Errors);
}

// torchtune's parser tags a max_filename override `!!str`: the digits stay a string (a zero-padded
// count of shards), as a quoted value does; YAML would read 00030 as octal 24 and 10 as an int.
TEST(ConfigOverrides, MaxFilenameStaysTheDigitsAsWritten) {
  ConfigNode t = load_config_yaml(
      "checkpointer:\n  checkpoint_files:\n    filename_format: model-{}-of-{}.safetensors\n    max_filename: \"00030\"\n",
      "c.yaml");
  for (const auto& [arg, want] : std::vector<std::pair<std::string, std::string>>{
           {"00010", "00010"}, {"10", "10"}, {"'00012'", "00012"}, {"\"00014\"", "00014"}}) {
    apply_overrides(t, {"checkpointer.checkpoint_files.max_filename=" + arg});
    const ConfigNode* v = t.find_path("checkpointer.checkpoint_files.max_filename");
    ASSERT_TRUE(v->is_string()) << arg;
    EXPECT_EQ(v->as_string(), want) << arg;
  }
}
