// The facade: lex with the dialect's whitespace options, parse, and render on demand.
#include "text/jinja/chat_template.h"

#include "text/jinja/lexer.h"
#include "text/jinja/parser.h"
#include "text/jinja/renderer.h"

namespace ktune::jinja {

Template::Template(std::string_view source, TemplateOptions options, std::string origin)
    : options_(options), origin_(std::move(origin)) {
  LexerOptions lexer;
  lexer.trim_blocks = lexer.lstrip_blocks = options_.dialect == Dialect::kTransformers;
  std::vector<Token> tokens = tokenize(source, lexer, origin_);
  body_ = parse_template(tokens, options_, origin_);
}

std::string Template::render(const nlohmann::ordered_json& context) const {
  Renderer renderer(options_, origin_);
  return renderer.render(body_, context);
}

}  // namespace ktune::jinja
