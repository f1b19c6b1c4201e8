// ktune's config system against torchtune itself: fixtures/torchtune_reference.json holds what
// torchtune 0.6.1's _merge_yaml_and_cli_args and OmegaConf make of scalars, overrides (including
// the upstream Kubeflow SDK's arguments on a torchtune YAML) and interpolations
// (fixtures/make_torchtune_reference.py wrote it by running them).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/config.h"
#include "train/config_interpolation.h"
#include "train/config_overrides.h"

using ktune::train::ConfigNode;
using nlohmann::json;

namespace {

json reference() {
  std::ifstream in(std::string(KTUNE_SOURCE_DIR) + "/tests/train/fixtures/torchtune_reference.json");
  EXPECT_TRUE(in.good());
  return json::parse(in);
}

// Empty when equal, else the first difference with its path.
std::string compare(const ConfigNode& n, const json& j, const std::string& path) {
  auto where = [&] { return (path.empty() ? "<root>" : path) + ": "; };
  if (j.is_object() && j.contains("float")) {  // inf/nan written as {"float": "inf"}
    std::string s = j["float"];
    if (!n.is_float()) return where() + "expected float " + s + ", got " + n.to_inline();
    double v = n.as_float();
    bool ok = s == "nan" ? std::isnan(v) : (std::isinf(v) && ((s[0] == '-') == (v < 0)));
    return ok ? "" : where() + "expected " + s + ", got " + n.to_inline();
  }
  switch (j.type()) {
    case json::value_t::null: return n.is_null() ? "" : where() + "expected null, got " + n.to_inline();
    case json::value_t::boolean:
      return n.is_bool() && n.as_bool() == j.get<bool>() ? "" : where() + "expected " + j.dump() + ", got " + n.to_inline();
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return n.is_int() && n.as_int() == j.get<std::int64_t>() ? "" : where() + "expected int " + j.dump() + ", got " + n.kind_name() + " " + n.to_inline();
    case json::value_t::number_float:
      return n.is_float() && n.as_float() == j.get<double>() ? "" : where() + "expected float " + j.dump() + ", got " + n.kind_name() + " " + n.to_inline();
    case json::value_t::string:
      return n.is_string() && n.as_string() == j.get<std::string>() ? "" : where() + "expected string " + j.dump() + ", got " + n.kind_name() + " " + n.to_inline();
    case json::value_t::array: {
      if (!n.is_list() || n.items().size() != j.size()) return where() + "expected list " + j.dump() + ", got " + n.to_inline();
      for (std::size_t i = 0; i < j.size(); ++i) {
        std::string d = compare(n.items()[i], j[i], path + "." + std::to_string(i));
        if (!d.empty()) return d;
      }
      return "";
    }
    case json::value_t::object: {
      if (!n.is_map() || n.entries().size() != j.size()) return where() + "expected map " + j.dump() + ", got " + n.to_inline();
      for (const auto& [k, v] : j.items()) {
        const ConfigNode* child = n.find(k);
        if (child == nullptr) return where() + "missing key " + k;
        std::string d = compare(*child, v, path.empty() ? k : path + "." + k);
        if (!d.empty()) return d;
      }
      return "";
    }
    default: return where() + "unexpected JSON";
  }
}

}  // namespace

TEST(ConfigReference, ScalarsAreTypedExactlyAsOmegaConfTypesThem) {
  json ref = reference();
  ASSERT_GE(ref["scalars"].size(), 30u);
  for (const auto& [text, expected] : ref["scalars"].items()) {
    ConfigNode typed = ktune::train::load_config_yaml("v: " + text + "\n", "scalar").find("v") != nullptr
                           ? *ktune::train::load_config_yaml("v: " + text + "\n", "scalar").find("v")
                           : ConfigNode();
    EXPECT_EQ(compare(typed, expected[1], "`" + text + "`"), "") << "python type " << expected[0];
    // Override values are typed the same way.
    EXPECT_EQ(compare(ktune::train::parse_override_value(text, "v"), expected[1], "override `" + text + "`"), "");
  }
}

TEST(ConfigReference, OverridesAndInterpolationGiveTorchtunesResolvedConfig) {
  json ref = reference();
  ASSERT_GE(ref["cases"].size(), 20u);
  for (const json& c : ref["cases"]) {
    std::string name = c["name"];
    std::vector<std::string> args = c["args"];
    bool expect_error = c["expected"].is_string() && c["expected"] == "error";
    try {
      ConfigNode tree = ktune::train::load_config_yaml(c["yaml"].get<std::string>(), name);
      ktune::train::apply_overrides(tree, args);
      ktune::train::resolve_interpolations(tree);
      if (expect_error) {
        ADD_FAILURE() << name << ": torchtune refuses this, ktune accepted it:\n" << tree.to_yaml();
        continue;
      }
      EXPECT_EQ(compare(tree, c["expected"], ""), "") << "case " << name;
    } catch (const std::exception& e) {
      if (!expect_error) ADD_FAILURE() << name << ": torchtune accepts this, ktune refused it: " << e.what();
    }
  }
}
