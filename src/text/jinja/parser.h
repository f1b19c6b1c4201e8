// Jinja2's parser (jinja2/parser.py): tokens → statements and expressions, with jinja2's grammar
// and precedence (filters bind tighter than arithmetic, ** is left-associative, `a if b` without
// else, `x is test arg`). Filters and tests are checked when parsing, as jinja2 checks them when
// compiling: an unknown name is a syntax error.
// Deliberately not here: template inheritance and includes ({% extends %}, {% block %},
// {% include %}, {% import %}), {% call %}, recursive loops, *args/**kwargs in calls. Each is a
// TemplateSyntaxError naming the tag or construct.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"
#include "text/jinja/template_options.h"

namespace ktune::jinja {

inline constexpr int kMaxExprDepth = 256;  // the deepest expression tree a template may have
inline constexpr int kMaxBlockDepth = 200; // the deepest nesting of blocks, parentheses and unary operators

// Throws TemplateError naming origin, line and column, and what was expected there.
Body parse_template(const std::vector<Token>& tokens, const TemplateOptions& options, const std::string& origin);

}  // namespace ktune::jinja
