// Jinja2's lexer: template text → tokens, with jinja2's whitespace rules exactly: newlines
// normalised to "\n" and one trailing newline dropped (keep_trailing_newline=False); `{%-`, `{{-`,
// `{#-` strip all whitespace before the tag and `-%}`, `-}}`, `-#}` all whitespace after it;
// trim_blocks drops the first newline after a block or comment tag (`+%}` keeps it); lstrip_blocks
// drops spaces and tabs between a line's start and a block or comment tag (`{%+` keeps them).
// `{% raw %}…{% endraw %}` becomes data. Comments produce nothing.
// Deliberately not here: line statements and custom delimiters (chat templates use neither).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ktune::jinja {

enum class TokenType {
  kData,           // template text outside tags
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,   // value: the unescaped text
  kInteger,  // int_value
  kFloat,    // float_value
  kOperator, // value: "+", "//", "(", ...
  kEof,
};

struct Token {
  TokenType type = TokenType::kEof;
  std::string value;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;  // in code points, 1-based
};

struct LexerOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
};

// Throws TemplateError naming origin, line and column on a lexical error (unterminated comment,
// an unexpected character, unbalanced brackets).
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options, const std::string& origin);

// jinja2's name for a token in "expected X, got Y" messages: "end of statement block", "'in'".
std::string describe_token(const Token& token);

}  // namespace ktune::jinja
