// The tree-walking renderer: statements append to the output, expressions evaluate to Values.
#include "text/jinja/renderer.h"

#include "text/jinja/builtins.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent)
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars)
    if (k == name) {
      v = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

namespace {

// Whether the body mentions a name anywhere (jinja2 gives a macro varargs / kwargs only then).
bool expr_mentions(const Expr* e, const std::string& name) {
  if (!e) return false;
  if (e->kind == ExprKind::kName && e->name == name) return true;
  for (const ExprPtr& a : e->args)
    if (expr_mentions(a.get(), name)) return true;
  for (const auto& kw : e->kwargs)
    if (expr_mentions(kw.second.get(), name)) return true;
  return false;
}

bool body_mentions(const Body& body, const std::string& name) {
  for (const StmtPtr& s : body) {
    if (expr_mentions(s->expr.get(), name) || expr_mentions(s->condition.get(), name) ||
        expr_mentions(s->filter.get(), name))
      return true;
    for (const ExprPtr& v : s->values)
      if (expr_mentions(v.get(), name)) return true;
    for (const auto& [test, branch] : s->branches)
      if (expr_mentions(test.get(), name) || body_mentions(branch, name)) return true;
    for (const auto& p : s->params)
      if (expr_mentions(p.second.get(), name)) return true;
    if (body_mentions(s->body, name) || body_mentions(s->else_body, name)) return true;
  }
  return false;
}

}  // namespace

Renderer::Renderer(const TemplateOptions& options, const std::string& origin) : options_(options), origin_(origin) {}

Scope* Renderer::new_scope(Scope* parent) {
  scopes_.emplace_back();
  scopes_.back().parent = parent;
  return &scopes_.back();
}

std::string Renderer::render(const Body& body, const nlohmann::ordered_json& context) {
  Scope* globals = new_scope(nullptr);
  if (context.is_object())
    for (auto it = context.begin(); it != context.end(); ++it) globals->set(it.key(), Value::from_json(it.value()));
  Scope* top = new_scope(globals);
  std::string out;
  try {
    render_body(body, top, out);
  } catch (const EvalFault& fault) {
    throw TemplateError(template_place(origin_, line_), fault.what());
  }
  return out;
}

Renderer::Flow Renderer::render_body(const Body& body, Scope* scope, std::string& out) {
  for (const StmtPtr& stmt : body) {
    Flow flow = render_stmt(*stmt, scope, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::render_stmt(const Stmt& stmt, Scope* scope, std::string& out) {
  line_ = stmt.line;
  switch (stmt.kind) {
    case StmtKind::kData: out += stmt.text; return Flow::kNormal;
    case StmtKind::kPrint: {
      Value v = eval(*stmt.expr, scope);
      out += to_str(v);
      return Flow::kNormal;
    }
    case StmtKind::kIf:
      for (const auto& [test, branch] : stmt.branches) {
        line_ = test->line;
        if (truthy(eval(*test, scope))) return render_body(branch, scope, out);
      }
      return render_body(stmt.else_body, scope, out);
    case StmtKind::kFor: return render_for(stmt, scope, out);
    case StmtKind::kSet: assign(stmt.targets[0], eval(*stmt.expr, scope), scope); return Flow::kNormal;
    case StmtKind::kSetBlock: {
      std::string text;
      render_body(stmt.body, new_scope(scope), text);
      Value v = Value::string(std::move(text));
      if (stmt.filter) v = apply_filter_chain(*stmt.filter, scope, v);
      assign(stmt.targets[0], v, scope);
      return Flow::kNormal;
    }
    case StmtKind::kMacro: define_macro(stmt, scope); return Flow::kNormal;
    case StmtKind::kFilterBlock: {
      std::string text;
      Flow flow = render_body(stmt.body, scope, text);
      out += to_str(apply_filter_chain(*stmt.filter, scope, Value::string(std::move(text))));
      return flow;
    }
    case StmtKind::kWith: {
      Scope* inner = new_scope(scope);
      std::vector<Value> values;
      for (const ExprPtr& v : stmt.values) values.push_back(eval(*v, scope));
      for (size_t i = 0; i < values.size(); ++i) assign(stmt.targets[i], values[i], inner);
      return render_body(stmt.body, inner, out);
    }
    case StmtKind::kBreak: return Flow::kBreak;
    case StmtKind::kContinue: return Flow::kContinue;
    case StmtKind::kGeneration: return render_body(stmt.body, scope, out);
  }
  return Flow::kNormal;
}

Renderer::Flow Renderer::render_for(const Stmt& stmt, Scope* scope, std::string& out) {
  Value iterable = eval(*stmt.expr, scope);
  std::vector<Value> items = iterate(iterable);
  if (stmt.condition) {
    std::vector<Value> kept;
    for (const Value& item : items) {
      Scope* filter_scope = new_scope(scope);
      assign(stmt.targets[0], item, filter_scope);
      if (truthy(eval(*stmt.condition, filter_scope))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) return render_body(stmt.else_body, new_scope(scope), out);

  const int64_t n = int64_t(items.size());
  auto changed_state = std::make_shared<std::pair<bool, std::vector<Value>>>();  // loop.changed's last args
  for (int64_t i = 0; i < n; ++i) {
    size_t mark = scopes_.size();
    Scope* body_scope = new_scope(scope);
    assign(stmt.targets[0], items[size_t(i)], body_scope);

    Value loop = Value::new_object("LoopContext", false);
    ObjectData& o = loop.object();
    o.set("index", Value::integer(i + 1));
    o.set("index0", Value::integer(i));
    o.set("revindex", Value::integer(n - i));
    o.set("revindex0", Value::integer(n - i - 1));
    o.set("first", Value::boolean(i == 0));
    o.set("last", Value::boolean(i == n - 1));
    o.set("length", Value::integer(n));
    o.set("depth", Value::integer(1));
    o.set("depth0", Value::integer(0));
    o.set("previtem", i > 0 ? items[size_t(i - 1)] : undefined("there is no previous item"));
    o.set("nextitem", i + 1 < n ? items[size_t(i + 1)] : undefined("there is no next item"));
    o.set("cycle", Value::callable("loop.cycle", [i](Renderer&, const CallArgs& args) {
            if (args.positional.empty()) fail("TypeError: no items for cycling given");
            return args.positional[size_t(i) % args.positional.size()];
          }));
    o.set("changed", Value::callable("loop.changed", [changed_state](Renderer&, const CallArgs& args) {
            auto& [has_last, last] = *changed_state;
            bool differs = !has_last || last.size() != args.positional.size();
            for (size_t k = 0; !differs && k < last.size(); ++k) differs = !equals(last[k], args.positional[k]);
            has_last = true;
            last = args.positional;
            return Value::boolean(differs);
          }));
    body_scope->set("loop", loop);

    Flow flow = render_body(stmt.body, body_scope, out);
    // Free this iteration's scopes unless a macro defined in them still needs them.
    bool captured = false;
    for (size_t k = mark; k < scopes_.size(); ++k) captured = captured || scopes_[k].captured;
    if (!captured)
      while (scopes_.size() > mark) scopes_.pop_back();
    if (flow == Flow::kBreak) break;
  }
  return Flow::kNormal;
}

void Renderer::assign(const Target& target, const Value& value, Scope* scope) {
  if (target.is_tuple) {
    std::vector<Value> items = iterate(value);
    if (items.size() < target.items.size())
      fail("ValueError: not enough values to unpack (expected " + std::to_string(target.items.size()) + ", got " +
           std::to_string(items.size()) + ")");
    if (items.size() > target.items.size())
      fail("ValueError: too many values to unpack (expected " + std::to_string(target.items.size()) + ")");
    for (size_t i = 0; i < items.size(); ++i) assign(target.items[i], items[i], scope);
    return;
  }
  if (target.attribute.empty()) {
    scope->set(target.name, value);
    return;
  }
  Value ns = lookup(target.name, scope);
  if (!ns.is_object() || !ns.object().assignable)
    fail("TemplateRuntimeError: cannot assign attribute on non-namespace object");
  if (sandboxed() && !target.attribute.empty() && target.attribute[0] == '_')
    fail("SecurityError: Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
         target.attribute + "'. Please rename the attribute.");
  ns.object().set(target.attribute, value);
}

Value Renderer::apply_filter_chain(const Expr& filter, Scope* scope, const Value& body) {
  Value subject = filter.args[0] ? apply_filter_chain(*filter.args[0], scope, body) : body;
  CallArgs args = eval_args(filter, 1, scope);
  line_ = filter.line;
  return apply_filter(*this, filter.name, subject, args);
}

void Renderer::define_macro(const Stmt& stmt, Scope* scope) {
  scope->captured = true;
  const Stmt* macro = &stmt;
  scope->set(stmt.name, Value::callable(stmt.name, [macro, scope](Renderer& r, const CallArgs& args) {
               return r.call_macro(*macro, scope, args);
             }));
}

Value Renderer::call_macro(const Stmt& macro, Scope* closure, const CallArgs& args) {
  if (call_depth_ >= kMaxCallDepth)
    fail("RecursionError: macro calls nested deeper than " + std::to_string(kMaxCallDepth) + " levels");
  int saved_line = line_;
  Scope* scope = new_scope(closure);
  const bool uses_varargs = body_mentions(macro.body, "varargs");
  const bool uses_kwargs = body_mentions(macro.body, "kwargs");
  const size_t n_params = macro.params.size();
  if (args.positional.size() > n_params && !uses_varargs)
    fail("TypeError: macro '" + macro.name + "' takes not more than " + std::to_string(n_params) + " argument(s)");
  std::vector<bool> bound(n_params, false);
  for (size_t i = 0; i < n_params && i < args.positional.size(); ++i) {
    scope->set(macro.params[i].first, args.positional[i]);
    bound[i] = true;
  }
  Value kwargs = Value::new_dict();
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < n_params && macro.params[i].first != key) ++i;
    if (i < n_params) {
      if (bound[i]) fail("TypeError: macro '" + macro.name + "' got multiple values for argument '" + key + "'");
      scope->set(key, value);
      bound[i] = true;
    } else if (uses_kwargs) {
      kwargs.dict().set(Value::string(key), value);
    } else {
      fail("TypeError: macro '" + macro.name + "' takes no keyword argument '" + key + "'");
    }
  }
  for (size_t i = 0; i < n_params; ++i) {
    if (bound[i]) continue;
    const auto& [name, default_value] = macro.params[i];
    scope->set(name, default_value ? eval(*default_value, scope) : undefined("parameter '" + name + "' was not provided"));
  }
  std::vector<Value> extra;
  for (size_t i = n_params; i < args.positional.size(); ++i) extra.push_back(args.positional[i]);
  scope->set("varargs", Value::new_tuple(extra));
  scope->set("kwargs", kwargs);
  std::string out;
  ++call_depth_;
  render_body(macro.body, scope, out);
  --call_depth_;
  line_ = saved_line;
  return Value::string(std::move(out));
}

Value Renderer::call(const Value& callee, const CallArgs& args) {
  if (callee.is_undefined()) callee.fail_undefined();
  if (!callee.is_callable()) fail("TypeError: '" + type_name(callee) + "' object is not callable");
  return callee.callable().fn(*this, args);
}

Value Renderer::lookup(const std::string& name, Scope* scope) const {
  if (const Value* v = scope->find(name)) return *v;
  if (const Value* g = find_global(options_.dialect, name)) return *g;
  return undefined("'" + name + "' is undefined");
}

CallArgs Renderer::eval_args(const Expr& expr, size_t first, Scope* scope) {
  CallArgs args;
  for (size_t i = first; i < expr.args.size(); ++i) args.positional.push_back(eval(*expr.args[i], scope));
  for (const auto& [key, value] : expr.kwargs) args.keyword.emplace_back(key, eval(*value, scope));
  return args;
}

Value Renderer::eval_compare(const Expr& expr, Scope* scope) {
  Value left = eval(*expr.args[0], scope);
  for (size_t i = 0; i < expr.compare_ops.size(); ++i) {
    Value right = eval(*expr.args[i + 1], scope);
    const std::string& op = expr.compare_ops[i];
    bool result;
    if (op == "==") result = equals(left, right);
    else if (op == "!=") result = !equals(left, right);
    else if (op == "in") result = contains(right, left);
    else if (op == "notin") result = !contains(right, left);
    else {
      int c = compare(left, right, op.c_str());
      result = op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0;
    }
    if (!result) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Value Renderer::eval(const Expr& expr, Scope* scope) {
  line_ = expr.line;
  switch (expr.kind) {
    case ExprKind::kConst: return expr.constant;
    case ExprKind::kName: return lookup(expr.name, scope);
    case ExprKind::kList:
    case ExprKind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& a : expr.args) items.push_back(eval(*a, scope));
      return expr.kind == ExprKind::kList ? Value::new_list(std::move(items)) : Value::new_tuple(std::move(items));
    }
    case ExprKind::kDict: {
      Value d = Value::new_dict();
      for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
        Value key = eval(*expr.args[i], scope);
        d.dict().set(key, eval(*expr.args[i + 1], scope));
      }
      return d;
    }
    case ExprKind::kGetAttr: {
      Value object = eval(*expr.args[0], scope);
      line_ = expr.line;
      if (object.is_undefined()) object.fail_undefined();
      return get_attribute(*this, object, expr.name);
    }
    case ExprKind::kGetItem: {
      Value object = eval(*expr.args[0], scope);
      const Expr& index = *expr.args[1];
      if (index.kind == ExprKind::kSlice) {
        Value parts[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int k = 0; k < 3; ++k)
          if (index.args[size_t(k)]) {
            parts[k] = eval(*index.args[size_t(k)], scope);
            ptrs[k] = &parts[k];
          }
        line_ = expr.line;
        if (object.is_undefined()) object.fail_undefined();
        return get_slice(object, ptrs[0], ptrs[1], ptrs[2]);
      }
      Value key = eval(index, scope);
      line_ = expr.line;
      if (object.is_undefined()) object.fail_undefined();
      return get_item(*this, object, key);
    }
    case ExprKind::kSlice: fail("TemplateSyntaxError: a slice outside brackets");
    case ExprKind::kCall: {
      Value callee = eval(*expr.args[0], scope);
      CallArgs args = eval_args(expr, 1, scope);
      line_ = expr.line;
      return call(callee, args);
    }
    case ExprKind::kFilter: {
      Value subject = eval(*expr.args[0], scope);
      CallArgs args = eval_args(expr, 1, scope);
      line_ = expr.line;
      return apply_filter(*this, expr.name, subject, args);
    }
    case ExprKind::kTest: {
      Value subject = eval(*expr.args[0], scope);
      CallArgs args = eval_args(expr, 1, scope);
      line_ = expr.line;
      return Value::boolean(apply_test(*this, expr.name, subject, args) != expr.negated);
    }
    case ExprKind::kNeg: return negate(eval(*expr.args[0], scope));
    case ExprKind::kPos: return unary_plus(eval(*expr.args[0], scope));
    case ExprKind::kNot: return Value::boolean(!truthy(eval(*expr.args[0], scope)));
    case ExprKind::kBinary: {
      Value a = eval(*expr.args[0], scope);
      Value b = eval(*expr.args[1], scope);
      line_ = expr.line;
      return binary_op(expr.op, a, b);
    }
    case ExprKind::kConcat: {
      std::string s;
      for (const ExprPtr& a : expr.args) s += to_str(eval(*a, scope));
      return Value::string(std::move(s));
    }
    case ExprKind::kCompare: return eval_compare(expr, scope);
    case ExprKind::kAnd: {
      Value left = eval(*expr.args[0], scope);
      return truthy(left) ? eval(*expr.args[1], scope) : left;
    }
    case ExprKind::kOr: {
      Value left = eval(*expr.args[0], scope);
      return truthy(left) ? left : eval(*expr.args[1], scope);
    }
    case ExprKind::kCondExpr: {
      if (truthy(eval(*expr.args[0], scope))) return eval(*expr.args[1], scope);
      if (expr.args[2]) return eval(*expr.args[2], scope);
      // jinja2 makes this a plain Undefined even under StrictUndefined (cond_expr_undefined).
      return Value::undefined("the inline if-expression on line " + std::to_string(expr.line) +
                                  " evaluated to false and no else section was defined.",
                              false);
    }
  }
  return Value::none();
}

}  // namespace ktune::jinja
