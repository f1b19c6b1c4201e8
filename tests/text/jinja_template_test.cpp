// Proves the C++ Jinja engine (src/text/jinja/) renders byte-equal to Python's jinja2 on the
// committed fixtures: fixtures/jinja_cases.json (every feature, both dialects, with and without
// StrictUndefined; made by fixtures/make_jinja_cases.py) and fixtures/real_chat_templates/cases.json
// (real models' chat templates, made by real_chat_templates/make_cases.py). Error cases check the
// C++ error message contains the fixture's fragment. Focused tests check that errors name the
// template's origin, line and column.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "text/jinja/chat_template.h"

namespace ktune::jinja {
namespace {

using nlohmann::ordered_json;

std::string fixtures() { return std::string(KTUNE_SOURCE_DIR) + "/tests/text/fixtures"; }

bool read_cases(const std::string& path, ordered_json* cases) {
  std::ifstream in(path);
  if (!in) return false;
  *cases = ordered_json::parse(in)["cases"];
  return true;
}

TemplateOptions options_of(const ordered_json& c) {
  TemplateOptions o;
  o.dialect = c["dialect"] == "transformers" ? Dialect::kTransformers : Dialect::kJinja2;
  o.strict_undefined = c.value("strict_undefined", false);
  return o;
}

// Renders one case and checks it; returns whether it passed.
bool check_case(const ordered_json& c) {
  const std::string name = c["name"].get<std::string>();
  SCOPED_TRACE(name);
  std::string output;
  std::string error;
  try {
    Template t(c["template"].get<std::string>(), options_of(c), name);
    output = t.render(c["context"]);
  } catch (const ktune::Error& e) {
    error = e.what();
  }
  if (c.contains("error")) {
    const std::string fragment = c["error"].get<std::string>();
    EXPECT_NE(error.find(fragment), std::string::npos)
        << "expected an error containing: " << fragment << "\ngot error: " << error << "\ngot output: " << output;
    return error.find(fragment) != std::string::npos;
  }
  EXPECT_EQ(error, "");
  EXPECT_EQ(output, c["output"].get<std::string>());
  return error.empty() && output == c["output"].get<std::string>();
}

void run_all(const ordered_json& cases) {
  size_t passed = 0;
  for (const ordered_json& c : cases) passed += check_case(c);
  std::cout << passed << " of " << cases.size() << " cases pass\n";
}

TEST(JinjaTemplate, RendersLikePythonJinja2OnEveryFeatureCase) {
  ordered_json cases;
  ASSERT_TRUE(read_cases(fixtures() + "/jinja_cases.json", &cases)) << "missing fixtures/jinja_cases.json";
  ASSERT_GT(cases.size(), 100u);
  run_all(cases);
}

TEST(JinjaTemplate, RendersRealChatTemplatesLikePython) {
  ordered_json cases;
  ASSERT_TRUE(read_cases(fixtures() + "/real_chat_templates/cases.json", &cases))
      << "missing fixtures/real_chat_templates/cases.json";
  ASSERT_GT(cases.size(), 300u);
  run_all(cases);
}

std::string error_of(const std::string& source, const ordered_json& context = ordered_json::object(),
                     TemplateOptions options = {}) {
  try {
    Template t(source, options, "cfg.json: chat_template");
    t.render(context);
  } catch (const ktune::Error& e) {
    return e.what();
  }
  return "";
}

TEST(JinjaTemplate, SyntaxErrorNamesOriginLineColumnAndWhatWasExpected) {
  std::string e = error_of("Hello\n{% for m in messages %}\n  {{ m.content }\n{% endfor %}");
  EXPECT_NE(e.find("cfg.json: chat_template, line 3, column 16"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected '}'"), std::string::npos) << e;

  e = error_of("{% if messages %}\n{{ messages[0] + }}{% endif %}");
  EXPECT_NE(e.find("cfg.json: chat_template, line 2, column 18"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected end of print statement"), std::string::npos) << e;

  e = error_of("{% set x = 1 2 %}");
  EXPECT_NE(e.find("line 1, column 14"), std::string::npos) << e;
  EXPECT_NE(e.find("expected end of statement block, got integer"), std::string::npos) << e;

  e = error_of("{% if x %}\n{% for a in b %}x{% endif %}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("'endfor'"), std::string::npos) << e;

  e = error_of("{% for x in y %}{{ x }}");
  EXPECT_NE(e.find("Unexpected end of template"), std::string::npos) << e;
  EXPECT_NE(e.find("'endfor'"), std::string::npos) << e;

  e = error_of("{{ x | no_such_filter }}");
  EXPECT_NE(e.find("No filter named 'no_such_filter'"), std::string::npos) << e;
  EXPECT_NE(e.find("line 1, column 8"), std::string::npos) << e;

  e = error_of("{% for x in y %}{% break %}{% endfor %}");
  EXPECT_NE(e.find("Encountered unknown tag 'break'"), std::string::npos) << e;
  EXPECT_EQ(error_of("{% for x in [1] %}{% break %}{% endfor %}", {}, {Dialect::kTransformers}), "");
}

TEST(JinjaTemplate, RuntimeErrorNamesOriginAndLine) {
  TemplateOptions strict{Dialect::kJinja2, true};
  std::string e = error_of("a\nb\n{{ missing }}", ordered_json::object(), strict);
  EXPECT_NE(e.find("cfg.json: chat_template, line 3"), std::string::npos) << e;
  EXPECT_NE(e.find("'missing' is undefined"), std::string::npos) << e;

  e = error_of("\n{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}");
  EXPECT_NE(e.find("line 2"), std::string::npos) << e;
  EXPECT_NE(e.find("Conversation roles must alternate user/assistant/user/assistant/..."), std::string::npos) << e;

  e = error_of("{{ 1 + 'a' }}");
  EXPECT_NE(e.find("unsupported operand type(s) for +: 'int' and 'str'"), std::string::npos) << e;
}

TEST(JinjaTemplate, RaiseExceptionThrowsTemplateError) {
  Template t("{{ raise_exception('bad role: ' ~ role) }}");
  EXPECT_THROW(t.render({{"role", "robot"}}), TemplateError);
  try {
    t.render({{"role", "robot"}});
  } catch (const TemplateError& e) {
    EXPECT_NE(std::string(e.what()).find("bad role: robot"), std::string::npos);
  }
}

TEST(JinjaTemplate, DeepNestingIsAnErrorNotACrash) {
  std::string deep(5000, '(');
  deep = "{{ " + deep + "1" + std::string(5000, ')') + " }}";
  EXPECT_NE(error_of(deep).find("nested deeper than"), std::string::npos);
  std::string blocks;
  for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
  for (int i = 0; i < 300; ++i) blocks += "{% endif %}";
  EXPECT_NE(error_of(blocks).find("nested deeper than"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 5000; ++i) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").find("nested deeper than"), std::string::npos);
  EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("RecursionError"), std::string::npos);
}

TEST(JinjaTemplate, TemplateRendersManyTimesWithDifferentContexts) {
  Template t("{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}\n{% endfor %}", {Dialect::kTransformers});
  ordered_json a = {{"messages", ordered_json::array({{{"role", "user"}, {"content", " hi "}}})}};
  ordered_json b = {{"messages", ordered_json::array()}};
  EXPECT_EQ(t.render(a), "<user>hi\n");
  EXPECT_EQ(t.render(b), "");
  EXPECT_EQ(t.render(a), "<user>hi\n");
}

}  // namespace
}  // namespace ktune::jinja
