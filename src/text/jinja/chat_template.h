// A Jinja2 template as Hugging Face chat templates need it: parsed once, rendered many times with
// a JSON context, byte-equal to Python's jinja2 in the dialect asked for (template_options.h).
//
//   ktune::jinja::Template t(config["chat_template"].get<std::string>(),
//                            {ktune::jinja::Dialect::kTransformers}, path + ": chat_template");
//   std::string prompt = t.render({{"messages", messages}, {"add_generation_prompt", true},
//                                  {"bos_token", "<s>"}});
//
// What it deliberately does not do: template inheritance, includes and imports, {% call %},
// recursive loops, autoescaping, custom filters, and Python objects beyond JSON values. See
// parser.h and filters.cpp for the constructs refused, each with an error that names it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "text/jinja/ast.h"
#include "text/jinja/template_error.h"
#include "text/jinja/template_options.h"

namespace ktune::jinja {

class Template {
 public:
  // Parses once; throws TemplateError (a ktune::Error) naming origin, line and column and what was
  // expected on a syntax error. origin names the template in errors, e.g.
  // "/path/tokenizer_config.json: chat_template".
  Template(std::string_view source, TemplateOptions options = {}, std::string origin = "template");

  // Renders with the context's top-level keys as variables. raise_exception("msg") throws a
  // TemplateError whose what() contains msg verbatim; other runtime errors (undefined under
  // strict, bad operand types) throw TemplateError naming origin and line.
  std::string render(const nlohmann::ordered_json& context) const;

  const TemplateOptions& options() const { return options_; }
  const std::string& origin() const { return origin_; }

 private:
  TemplateOptions options_;
  std::string origin_;
  Body body_;
};

}  // namespace ktune::jinja
