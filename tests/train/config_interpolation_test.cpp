// `${…}` interpolation: absolute, relative, typed, embedded, env, escapes, and every error.
#include <gtest/gtest.h>

#include <cstdlib>

#include "core/error.h"
#include "train/config.h"
#include "train/config_interpolation.h"
#include "train/config_overrides.h"

using ktune::train::ConfigNode;
using ktune::train::load_config_yaml;
using ktune::train::resolve_interpolations;

namespace {
ConfigNode resolved(const std::string& yaml) {
  ConfigNode t = load_config_yaml(yaml, "t.yaml");
  resolve_interpolations(t);
  return t;
}
std::string errors_of(const std::string& yaml) {
  ConfigNode t = load_config_yaml(yaml, "t.yaml");
  try {
    resolve_interpolations(t);
  } catch (const ktune::Errors& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(ConfigInterpolation, OutputDirFlowsIntoNestedKeysAfterOverrides) {
  ConfigNode t = load_config_yaml(
      "output_dir: /tmp/a\ncheckpointer:\n  output_dir: ${output_dir}\nmetric_logger:\n  log_dir: ${output_dir}/logs\n",
      "t.yaml");
  ktune::train::apply_overrides(t, {"output_dir=/workspace/output"});
  resolve_interpolations(t);
  EXPECT_EQ(t.find_path("checkpointer.output_dir")->as_string(), "/workspace/output");
  EXPECT_EQ(t.find_path("metric_logger.log_dir")->as_string(), "/workspace/output/logs");
}

TEST(ConfigInterpolation, WholeValueKeepsTypeEmbeddedUsesPythonStr) {
  ConfigNode t = resolved("n: 8\nf: 0.0003\nb: true\nz: null\nm: {k: 1}\nwhole: ${n}\nmap: ${m}\n"
                          "text: r${n}-${f}-${b}-${z}\n");
  EXPECT_EQ(t.find("whole")->as_int(), 8);
  EXPECT_EQ(t.find_path("map.k")->as_int(), 1);
  EXPECT_EQ(t.find("text")->as_string(), "r8-0.0003-True-None");
}

TEST(ConfigInterpolation, ChainsAndRelativeKeys) {
  ConfigNode t = resolved("a: ${b}/x\nb: ${c}/y\nc: root\nsec:\n  k: 1\n  same: ${.k}\n  up: ${..c}\n");
  EXPECT_EQ(t.find("a")->as_string(), "root/y/x");
  EXPECT_EQ(t.find_path("sec.same")->as_int(), 1);
  EXPECT_EQ(t.find_path("sec.up")->as_string(), "root");
}

TEST(ConfigInterpolation, EnvironmentResolverWithDefault) {
  ::setenv("KTUNE_TEST_INTERP", "/data", 1);
  ConfigNode t = resolved("a: ${oc.env:KTUNE_TEST_INTERP}/x\nb: ${oc.env:KTUNE_TEST_UNSET_VAR,fallback}\n");
  EXPECT_EQ(t.find("a")->as_string(), "/data/x");
  EXPECT_EQ(t.find("b")->as_string(), "fallback");
  EXPECT_NE(errors_of("a: ${oc.env:KTUNE_TEST_UNSET_VAR}\n").find("KTUNE_TEST_UNSET_VAR is not set"), std::string::npos);
}

// OmegaConf 2.3's results (checked in torchtune 0.6.1's environment): oc.env gives a string, its
// default too (str() of it; null stays None); oc.select a key's typed value or its default (None
// without one); `[i]` indexes lists; spaces inside ${ } do not count.
TEST(ConfigInterpolation, ResolversIndexesAndSpacesAsOmegaConf) {
  ::unsetenv("KTUNE_TEST_UNSET_VAR");
  ConfigNode t = resolved(
      "a: {x: [1, {y: 2}], z: 3}\n"
      "env_int: ${oc.env:KTUNE_TEST_UNSET_VAR,5}\nenv_float: ${oc.env:KTUNE_TEST_UNSET_VAR, 3e-4}\n"
      "env_null: ${oc.env:KTUNE_TEST_UNSET_VAR,null}\nenv_quoted: ${oc.env:KTUNE_TEST_UNSET_VAR,'a b'}\n"
      "env_bool: ${oc.env:KTUNE_TEST_UNSET_VAR,true}\n"
      "sel: ${oc.select:a.z}\nsel_default: ${oc.select:a.nope, 7}\nsel_none: ${oc.select:a.nope}\n"
      "sel_rel: ${oc.select:.a.z,0}\nindexed: ${a.x[1].y}\ndotted: ${a.x.1.y}\nspaced: ${ a.z }\n"
      "text: x${ a.x[0] }y\n");
  EXPECT_EQ(t.find("env_int")->as_string(), "5");
  EXPECT_EQ(t.find("env_float")->as_string(), "0.0003");
  EXPECT_TRUE(t.find("env_null")->is_null());
  EXPECT_EQ(t.find("env_quoted")->as_string(), "a b");
  EXPECT_EQ(t.find("env_bool")->as_string(), "True");
  EXPECT_EQ(t.find("sel")->as_int(), 3);
  EXPECT_EQ(t.find("sel_default")->as_int(), 7);
  EXPECT_TRUE(t.find("sel_none")->is_null());
  EXPECT_EQ(t.find("sel_rel")->as_int(), 3);
  EXPECT_EQ(t.find("indexed")->as_int(), 2);
  EXPECT_EQ(t.find("dotted")->as_int(), 2);
  EXPECT_EQ(t.find("spaced")->as_int(), 3);
  EXPECT_EQ(t.find("text")->as_string(), "x1y");
  EXPECT_NE(errors_of("a: [1]\nb: ${a[3]}\n").find("key `a.3` not found"), std::string::npos);
}

TEST(ConfigInterpolation, EscapedDollarIsLiteral) {
  EXPECT_EQ(resolved("a: \\${b}\nb: 1\n").find("a")->as_string(), "${b}");
}

TEST(ConfigInterpolation, MissingKeyIsAnErrorNamingHolderAndSuggestion) {
  std::string m = errors_of("output_dir: /x\nlog: ${output_dri}/logs\n");
  EXPECT_NE(m.find("config key log"), std::string::npos) << m;
  EXPECT_NE(m.find("key `output_dri` not found"), std::string::npos) << m;
  EXPECT_NE(m.find("did you mean `output_dir`?"), std::string::npos) << m;
}

TEST(ConfigInterpolation, CyclesAreErrors) {
  EXPECT_NE(errors_of("a: ${b}\nb: ${a}\n").find("interpolation cycle"), std::string::npos);
  EXPECT_NE(errors_of("a: ${a}\n").find("interpolation cycle"), std::string::npos);
  EXPECT_NE(errors_of("m:\n  x: ${m}\n").find("interpolation cycle"), std::string::npos);
}

TEST(ConfigInterpolation, OtherProblemsAreErrorsAndAllAreReported) {
  std::string m = errors_of("l: [1]\na: x${l}\nb: ${oc.decode:1}\nc: ${unclosed\nd: ${nope}\n");
  EXPECT_NE(m.find("4 errors"), std::string::npos) << m;
  EXPECT_NE(m.find("cannot be part of a string"), std::string::npos) << m;
  EXPECT_NE(m.find("unsupported resolver"), std::string::npos) << m;
  EXPECT_NE(m.find("unclosed interpolation"), std::string::npos) << m;
}

TEST(ConfigInterpolation, PythonStrOfFloats) {
  using ktune::train::python_str;
  EXPECT_EQ(python_str(ConfigNode::number(2.0)), "2.0");
  EXPECT_EQ(python_str(ConfigNode::number(1e-5)), "1e-05");
  EXPECT_EQ(python_str(ConfigNode::number(0.0003)), "0.0003");
  EXPECT_EQ(python_str(ConfigNode::number(123456789.0)), "123456789.0");
}
