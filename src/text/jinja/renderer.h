// Renders a parsed template with jinja2's runtime semantics: scopes (a for loop's body and a macro's
// body are their own scope, so a set inside them does not leak out; an if's body is not), the
// `loop` variable, macros with defaults, varargs and kwargs, namespaces, Undefined and
// StrictUndefined, break/continue, and errors that name the template line where they happened.
// Builtins (filters, tests, methods, globals) reach back into the renderer for the dialect, for
// making Undefined values and for calling template macros.
#pragma once

#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/template_options.h"
#include "text/jinja/value.h"

namespace ktune::jinja {

inline constexpr int kMaxCallDepth = 100;  // macro calls inside macro calls

// The variables of one scope; parent is the enclosing scope (nullptr for the template's context).
struct Scope {
  Scope* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  bool captured = false;  // a macro defined here keeps it alive past its block
  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};

class Renderer {
 public:
  Renderer(const TemplateOptions& options, const std::string& origin);

  // Throws TemplateError naming the origin and the line of the failing node.
  std::string render(const Body& body, const nlohmann::ordered_json& context);

  const TemplateOptions& options() const { return options_; }
  bool sandboxed() const { return options_.dialect == Dialect::kTransformers; }
  // An Undefined of this environment's kind (Undefined or StrictUndefined).
  Value undefined(std::string hint) const { return Value::undefined(std::move(hint), options_.strict_undefined); }
  // callee(args): a macro, a bound method, a global.
  Value call(const Value& callee, const CallArgs& args);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Scope* new_scope(Scope* parent);
  Flow render_body(const Body& body, Scope* scope, std::string& out);
  Flow render_stmt(const Stmt& stmt, Scope* scope, std::string& out);
  Flow render_for(const Stmt& stmt, Scope* scope, std::string& out);
  void define_macro(const Stmt& stmt, Scope* scope);
  Value call_macro(const Stmt& macro, Scope* closure, const CallArgs& args);
  void assign(const Target& target, const Value& value, Scope* scope);
  Value apply_filter_chain(const Expr& filter, Scope* scope, const Value& body);

  Value eval(const Expr& expr, Scope* scope);
  Value lookup(const std::string& name, Scope* scope) const;
  Value eval_compare(const Expr& expr, Scope* scope);
  CallArgs eval_args(const Expr& expr, size_t first, Scope* scope);

  const TemplateOptions& options_;
  const std::string& origin_;
  std::deque<Scope> scopes_;  // every scope of this render; freed together at its end
  int line_ = 0;              // the line of the node being evaluated, for error messages
  int call_depth_ = 0;
};

}  // namespace ktune::jinja
