// A recursive-descent parser with one function per rule of jinja2's parser.py, in its order.
#include "text/jinja/parser.h"

#include <algorithm>
#include <initializer_list>

#include "text/jinja/builtins.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const TemplateOptions& options, const std::string& origin)
      : tokens_(tokens), options_(options), origin_(origin) {}

  Body parse() { return subparse({}); }

 private:
  // --- the token stream
  const Token& current() const { return tokens_[pos_]; }
  const Token& look() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  const Token& next() {
    const Token& t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  bool is_op(const char* op) const { return current().type == TokenType::kOperator && current().value == op; }
  bool is_name(const char* name) const { return current().type == TokenType::kName && current().value == name; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_at(const Token& t, const std::string& message) const {
    syntax_error(origin_, t.line, t.column, message);
  }
  [[noreturn]] void fail(const std::string& message) const { fail_at(current(), message); }
  const Token& expect(TokenType type, const std::string& what) {
    if (current().type != type) {
      if (current().type == TokenType::kEof) fail("unexpected end of template, expected " + what);
      fail("expected " + what + ", got " + describe_token(current()));
    }
    return next();
  }
  void expect_op(const char* op) {
    if (!is_op(op)) {
      if (current().type == TokenType::kEof) fail(std::string("unexpected end of template, expected '") + op + "'");
      fail(std::string("expected '") + op + "', got " + describe_token(current()));
    }
    next();
  }
  void expect_name(const char* name) {
    if (!is_name(name)) fail(std::string("expected 'name:") + name + "', got " + describe_token(current()));
    next();
  }
  void expect_block_end() { expect(TokenType::kBlockEnd, "end of statement block"); }

  // --- nodes
  ExprPtr node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }
  ExprPtr add(ExprPtr parent, ExprPtr child) {
    if (child) {
      parent->depth = std::max(parent->depth, child->depth + 1);
      if (parent->depth > kMaxExprDepth)
        fail("expression nested deeper than " + std::to_string(kMaxExprDepth) + " levels");
    }
    parent->args.push_back(std::move(child));
    return parent;
  }
  ExprPtr unary(ExprKind kind, int line, ExprPtr operand) { return add(node(kind, line), std::move(operand)); }
  ExprPtr binary(ExprKind kind, int line, ExprPtr lhs, ExprPtr rhs) {
    return add(add(node(kind, line), std::move(lhs)), std::move(rhs));
  }

  // --- statements
  struct DepthGuard {
    DepthGuard(Parser& p) : p(p) {
      if (++p.block_depth_ > kMaxBlockDepth)
        p.fail("template nested deeper than " + std::to_string(kMaxBlockDepth) + " levels");
    }
    ~DepthGuard() { --p.block_depth_; }
    Parser& p;
  };

  bool at_end_tag(const std::vector<std::string>& end_tags) const {
    return current().type == TokenType::kName &&
           std::find(end_tags.begin(), end_tags.end(), current().value) != end_tags.end();
  }

  Body subparse(const std::vector<std::string>& end_tags) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = current();
      if (t.type == TokenType::kEof) {
        if (!end_tags.empty()) fail_eof(end_tags);
        return body;
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kData;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        next();
      } else if (t.type == TokenType::kVariableBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kPrint;
        s->line = t.line;
        s->expr = parse_tuple(false, true, {}, false);
        expect(TokenType::kVariableEnd, "end of print statement");
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        next();
        if (at_end_tag(end_tags)) return body;
        body.push_back(parse_statement(end_tags));
        expect_block_end();
      } else {
        fail("internal error: unexpected " + describe_token(t));
      }
    }
  }

  [[noreturn]] void fail_eof(const std::vector<std::string>& end_tags) const {
    std::string message = "Unexpected end of template.";
    if (!end_tags.empty()) {
      message += " Jinja was looking for the following tags: ";
      for (size_t i = 0; i < end_tags.size(); ++i)
        message += (i ? (i + 1 == end_tags.size() ? " or " : ", ") : "") + ("'" + end_tags[i] + "'");
      message += ".";
    }
    if (!open_blocks_.empty()) message += " The innermost block that needs to be closed is '" + open_blocks_.back() + "'.";
    fail(message);
  }

  // Parses "%} body" up to one of end_tags; leaves the stream at the end tag's name, or past it
  // when drop_needle.
  Body parse_statements(const std::vector<std::string>& end_tags, bool drop_needle) {
    expect_block_end();
    Body body = subparse(end_tags);
    if (current().type == TokenType::kEof) fail_eof(end_tags);
    if (drop_needle) next();
    return body;
  }

  StmtPtr parse_statement(const std::vector<std::string>& end_tags) {
    const Token& t = current();
    if (t.type != TokenType::kName) fail("tag name expected");
    const std::string tag = t.value;
    auto s = std::make_unique<Stmt>();
    s->line = t.line;
    open_blocks_.push_back(tag);
    bool pushed = true;
    auto done = [&]() {
      if (pushed) open_blocks_.pop_back();
      pushed = false;
    };
    if (tag == "if") parse_if(*s);
    else if (tag == "for") parse_for(*s);
    else if (tag == "set") parse_set(*s);
    else if (tag == "macro") parse_macro(*s);
    else if (tag == "filter") parse_filter_block(*s);
    else if (tag == "with") parse_with(*s);
    else if ((tag == "break" || tag == "continue") && options_.dialect == Dialect::kTransformers) {
      next();
      if (loop_depth_ == 0) fail_at(t, "'" + tag + "' outside loop");
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    } else if (tag == "generation" && options_.dialect == Dialect::kTransformers) {
      next();
      s->kind = StmtKind::kGeneration;
      s->body = parse_statements({"endgeneration"}, true);
    } else {
      done();
      std::string message = "Encountered unknown tag '" + tag + "'.";
      static const char* const kUnsupported[] = {"extends", "block", "include", "import", "from", "call",
                                                 "autoescape", "trans", "do"};
      for (const char* u : kUnsupported)
        if (tag == u) message = "the '" + tag + "' tag is not supported by ktune's Jinja engine.";
      if (!end_tags.empty()) {
        message += " Jinja was looking for the following tags: ";
        for (size_t i = 0; i < end_tags.size(); ++i)
          message += (i ? (i + 1 == end_tags.size() ? " or " : ", ") : "") + ("'" + end_tags[i] + "'");
        message += ".";
      }
      fail_at(t, message);
    }
    done();
    return s;
  }

  void parse_if(Stmt& s) {
    next();
    s.kind = StmtKind::kIf;
    ExprPtr test = parse_tuple(false, false, {}, false);
    while (true) {
      Body body = parse_statements({"elif", "else", "endif"}, false);
      s.branches.emplace_back(std::move(test), std::move(body));
      const std::string tag = next().value;
      if (tag == "elif") {
        test = parse_tuple(false, false, {}, false);
        continue;
      }
      if (tag == "else") s.else_body = parse_statements({"endif"}, true);
      break;
    }
  }

  void parse_for(Stmt& s) {
    next();
    s.kind = StmtKind::kFor;
    s.targets.push_back(parse_assign_target({"in"}));
    expect_name("in");
    s.expr = parse_tuple(false, false, {"recursive"}, false);
    if (skip_name("if")) s.condition = parse_expression(true);
    if (is_name("recursive")) fail("recursive for loops are not supported by ktune's Jinja engine");
    ++loop_depth_;
    s.body = parse_statements({"endfor", "else"}, false);
    --loop_depth_;
    if (next().value == "else") s.else_body = parse_statements({"endfor"}, true);
  }

  void parse_set(Stmt& s) {
    next();
    if (current().type == TokenType::kName && look().type == TokenType::kOperator && look().value == ".") {
      Target t;
      t.name = next().value;
      next();
      t.attribute = expect(TokenType::kName, "name").value;
      s.targets.push_back(std::move(t));
    } else {
      s.targets.push_back(parse_assign_target({}));
    }
    if (skip_op("=")) {
      s.kind = StmtKind::kSet;
      s.expr = parse_tuple(false, true, {}, false);
      return;
    }
    s.kind = StmtKind::kSetBlock;
    if (!s.targets[0].attribute.empty() || s.targets[0].is_tuple)
      fail("a block set assigns to one name");
    if (is_op("|")) s.filter = parse_filter(nullptr, false);
    s.body = parse_statements({"endset"}, true);
  }

  void parse_macro(Stmt& s) {
    next();
    s.kind = StmtKind::kMacro;
    s.name = expect(TokenType::kName, "name").value;
    expect_op("(");
    bool has_default = false;
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      std::string param = expect(TokenType::kName, "name").value;
      ExprPtr default_value;
      if (skip_op("=")) {
        default_value = parse_expression(true);
        has_default = true;
      } else if (has_default) {
        fail("non-default argument follows default argument");
      }
      s.params.emplace_back(std::move(param), std::move(default_value));
    }
    expect_op(")");
    int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    s.body = parse_statements({"endmacro"}, true);
    loop_depth_ = saved_loop_depth;
  }

  void parse_filter_block(Stmt& s) {
    next();
    s.kind = StmtKind::kFilterBlock;
    s.filter = parse_filter(nullptr, true);
    s.body = parse_statements({"endfilter"}, true);
  }

  void parse_with(Stmt& s) {
    next();
    s.kind = StmtKind::kWith;
    while (current().type != TokenType::kBlockEnd) {
      if (!s.targets.empty()) expect_op(",");
      s.targets.push_back(parse_assign_target({}));
      expect_op("=");
      s.values.push_back(parse_expression(true));
    }
    s.body = parse_statements({"endwith"}, true);
  }

  // name | name, name | (name, name), ... as jinja2's parse_assign_target with a tuple.
  Target parse_assign_target(const std::vector<std::string>& extra_end) {
    Target tuple;
    tuple.is_tuple = false;
    bool comma = false;
    while (true) {
      if (comma) expect_op(",");
      if (current().type == TokenType::kBlockEnd || is_op(")") || at_end_tag(extra_end) || is_op("=")) break;
      tuple.items.push_back(parse_target_primary());
      if (is_op(",")) comma = tuple.is_tuple = true;
      else break;
    }
    if (!tuple.is_tuple) {
      if (tuple.items.empty()) fail("expected an assignment target, got " + describe_token(current()));
      return std::move(tuple.items[0]);
    }
    return tuple;
  }

  Target parse_target_primary() {
    if (current().type == TokenType::kName) {
      const Token& t = next();
      if (t.value == "true" || t.value == "false" || t.value == "none" || t.value == "True" || t.value == "False" ||
          t.value == "None")
        fail_at(t, "can't assign to '" + t.value + "'");
      Target target;
      target.name = t.value;
      return target;
    }
    if (skip_op("(")) {
      Target t = parse_assign_target({});
      expect_op(")");
      return t;
    }
    fail("can't assign to " + describe_token(current()));
  }

  // --- expressions
  bool is_tuple_end(const std::vector<std::string>& extra_end) const {
    TokenType t = current().type;
    return t == TokenType::kVariableEnd || t == TokenType::kBlockEnd || is_op(")") || at_end_tag(extra_end);
  }

  ExprPtr parse_tuple(bool simplified, bool with_condexpr, const std::vector<std::string>& extra_end,
                      bool explicit_parentheses) {
    int line = current().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (is_tuple_end(extra_end)) break;
      items.push_back(simplified ? parse_primary() : parse_expression(with_condexpr));
      if (is_op(",")) is_tuple = true;
      else break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) {
        if (current().type == TokenType::kEof) fail("unexpected end of template, expected an expression");
        fail("expected an expression, got " + describe_token(current()));
      }
    }
    ExprPtr t = node(ExprKind::kTuple, line);
    for (ExprPtr& item : items) t = add(std::move(t), std::move(item));
    return t;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_condexpr() : parse_or(); }

  ExprPtr parse_condexpr() {
    int line = current().line;
    ExprPtr expr1 = parse_or();
    while (skip_name("if")) {
      ExprPtr expr2 = parse_or();
      ExprPtr expr3 = skip_name("else") ? parse_condexpr() : nullptr;
      ExprPtr c = node(ExprKind::kCondExpr, line);
      c = add(std::move(c), std::move(expr2));
      c = add(std::move(c), std::move(expr1));
      expr1 = add(std::move(c), std::move(expr3));
    }
    return expr1;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      int line = next().line;
      left = binary(ExprKind::kOr, line, std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      int line = next().line;
      left = binary(ExprKind::kAnd, line, std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      int line = next().line;
      DepthGuard guard(*this);
      return unary(ExprKind::kNot, line, parse_not());
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    int line = current().line;
    ExprPtr expr = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (current().type == TokenType::kOperator &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().value;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && look().type == TokenType::kName && look().value == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) cmp = add(node(ExprKind::kCompare, line), std::move(expr));
      cmp->compare_ops.push_back(op);
      cmp = add(std::move(cmp), parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(expr);
  }

  ExprPtr parse_binary_chain(std::initializer_list<std::pair<const char*, BinaryOp>> ops, ExprPtr (Parser::*operand)()) {
    ExprPtr left = (this->*operand)();
    while (true) {
      const std::pair<const char*, BinaryOp>* found = nullptr;
      for (const auto& o : ops)
        if (is_op(o.first)) found = &o;
      if (!found) return left;
      int line = next().line;
      ExprPtr b = binary(ExprKind::kBinary, line, std::move(left), (this->*operand)());
      b->op = found->second;
      left = std::move(b);
    }
  }

  ExprPtr parse_math1() {
    return parse_binary_chain({{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}}, &Parser::parse_concat);
  }

  ExprPtr parse_concat() {
    int line = current().line;
    ExprPtr first = parse_math2();
    if (!is_op("~")) return first;
    ExprPtr c = add(node(ExprKind::kConcat, line), std::move(first));
    while (skip_op("~")) c = add(std::move(c), parse_math2());
    return c;
  }

  ExprPtr parse_math2() {
    return parse_binary_chain(
        {{"*", BinaryOp::kMul}, {"/", BinaryOp::kDiv}, {"//", BinaryOp::kFloorDiv}, {"%", BinaryOp::kMod}},
        &Parser::parse_pow);
  }

  ExprPtr parse_pow() { return parse_binary_chain({{"**", BinaryOp::kPow}}, &Parser::parse_unary_filtered); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr n;
    int line = current().line;
    if (skip_op("-")) n = unary(ExprKind::kNeg, line, parse_unary(false));
    else if (skip_op("+")) n = unary(ExprKind::kPos, line, parse_unary(false));
    else n = parse_primary();
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expr(std::move(n));
    return n;
  }

  ExprPtr constant(int line, Value v) {
    ExprPtr c = node(ExprKind::kConst, line);
    c->constant = std::move(v);
    return c;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    int line = t.line;
    switch (t.type) {
      case TokenType::kName: {
        next();
        if (t.value == "true" || t.value == "True") return constant(line, Value::boolean(true));
        if (t.value == "false" || t.value == "False") return constant(line, Value::boolean(false));
        if (t.value == "none" || t.value == "None") return constant(line, Value::none());
        ExprPtr n = node(ExprKind::kName, line);
        n->name = t.value;
        return n;
      }
      case TokenType::kString: {
        std::string text;
        while (current().type == TokenType::kString) text += next().value;
        return constant(line, Value::string(text));
      }
      case TokenType::kInteger: next(); return constant(line, Value::integer(t.int_value));
      case TokenType::kFloat: next(); return constant(line, Value::number(t.float_value));
      case TokenType::kOperator:
        if (t.value == "(") {
          next();
          DepthGuard guard(*this);
          ExprPtr inner = parse_tuple(false, true, {}, true);
          expect_op(")");
          return inner;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    if (t.type == TokenType::kEof) fail("unexpected end of template, expected an expression");
    fail("unexpected " + describe_token(t));
  }

  ExprPtr parse_list() {
    int line = next().line;
    DepthGuard guard(*this);
    ExprPtr l = node(ExprKind::kList, line);
    while (!is_op("]")) {
      if (!l->args.empty()) expect_op(",");
      if (is_op("]")) break;
      l = add(std::move(l), parse_expression(true));
    }
    expect_op("]");
    return l;
  }

  ExprPtr parse_dict() {
    int line = next().line;
    DepthGuard guard(*this);
    ExprPtr d = node(ExprKind::kDict, line);
    while (!is_op("}")) {
      if (!d->args.empty()) expect_op(",");
      if (is_op("}")) break;
      d = add(std::move(d), parse_expression(true));
      expect_op(":");
      d = add(std::move(d), parse_expression(true));
    }
    expect_op("}");
    return d;
  }

  ExprPtr parse_postfix(ExprPtr n) {
    while (true) {
      if (is_op(".") || is_op("[")) n = parse_subscript(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr n) {
    while (true) {
      if (is_op("|")) n = parse_filter(std::move(n), false);
      else if (is_name("is")) n = parse_test(std::move(n));
      else if (is_op("(")) n = parse_call(std::move(n));
      else return n;
    }
  }

  ExprPtr parse_subscript(ExprPtr n) {
    const Token& t = next();
    if (t.value == ".") {
      const Token& attr = next();
      if (attr.type == TokenType::kName) {
        ExprPtr g = add(node(ExprKind::kGetAttr, t.line), std::move(n));
        g->name = attr.value;
        return g;
      }
      if (attr.type != TokenType::kInteger) fail_at(attr, "expected name or number, got " + describe_token(attr));
      return binary(ExprKind::kGetItem, t.line, std::move(n), constant(attr.line, Value::integer(attr.int_value)));
    }
    std::vector<ExprPtr> items;
    while (!is_op("]")) {
      if (!items.empty()) expect_op(",");
      items.push_back(parse_subscribed());
    }
    expect_op("]");
    ExprPtr index;
    if (items.size() == 1) {
      index = std::move(items[0]);
    } else {
      index = node(ExprKind::kTuple, t.line);
      for (ExprPtr& item : items) index = add(std::move(index), std::move(item));
    }
    return binary(ExprKind::kGetItem, t.line, std::move(n), std::move(index));
  }

  ExprPtr parse_subscribed() {
    int line = current().line;
    std::vector<ExprPtr> parts;
    if (skip_op(":")) {
      parts.push_back(nullptr);
    } else {
      ExprPtr first = parse_expression(true);
      if (!is_op(":")) return first;
      next();
      parts.push_back(std::move(first));
    }
    if (is_op(":") || is_op("]") || is_op(",")) parts.push_back(nullptr);
    else parts.push_back(parse_expression(true));
    if (skip_op(":")) {
      if (is_op("]") || is_op(",")) parts.push_back(nullptr);
      else parts.push_back(parse_expression(true));
    } else {
      parts.push_back(nullptr);
    }
    ExprPtr s = node(ExprKind::kSlice, line);
    for (ExprPtr& p : parts) s = add(std::move(s), std::move(p));
    return s;
  }

  // (args, key=value): appended to call's args and kwargs.
  ExprPtr parse_call_args(ExprPtr call) {
    expect_op("(");
    bool require_comma = false;
    while (!is_op(")")) {
      if (require_comma) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported by ktune's Jinja engine");
      if (current().type == TokenType::kName && look().type == TokenType::kOperator && look().value == "=") {
        std::string key = next().value;
        next();
        ExprPtr value = parse_expression(true);
        call->depth = std::max(call->depth, value->depth + 1);
        call->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!call->kwargs.empty()) fail("Invalid argument syntax: a positional argument follows a keyword argument");
        call = add(std::move(call), parse_expression(true));
      }
      require_comma = true;
    }
    expect_op(")");
    return call;
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr call = add(node(ExprKind::kCall, current().line), std::move(callee));
    return parse_call_args(std::move(call));
  }

  std::string parse_dotted_name() {
    std::string name = expect(TokenType::kName, "name").value;
    while (skip_op(".")) name += "." + expect(TokenType::kName, "name").value;
    return name;
  }

  ExprPtr parse_filter(ExprPtr subject, bool start_inline) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const Token& name_token = current();
      std::string name = parse_dotted_name();
      if (!has_filter(name)) fail_at(name_token, "No filter named '" + name + "'.");
      ExprPtr f = add(node(ExprKind::kFilter, name_token.line), std::move(subject));
      f->name = name;
      if (is_op("(")) f = parse_call_args(std::move(f));
      subject = std::move(f);
    }
    return subject;
  }

  ExprPtr parse_test(ExprPtr subject) {
    int line = next().line;  // 'is'
    bool negated = skip_name("not");
    const Token& name_token = current();
    std::string name = parse_dotted_name();
    if (!has_test(name)) fail_at(name_token, "No test named '" + name + "'.");
    ExprPtr t = add(node(ExprKind::kTest, line), std::move(subject));
    t->name = name;
    t->negated = negated;
    const Token& c = current();
    bool arg_start = c.type == TokenType::kName || c.type == TokenType::kString || c.type == TokenType::kInteger ||
                     c.type == TokenType::kFloat || is_op("[") || is_op("{");
    if (is_op("(")) {
      t = parse_call_args(std::move(t));
    } else if (arg_start && !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("You cannot chain multiple tests with is");
      t = add(std::move(t), parse_postfix(parse_primary()));
    }
    return t;
  }

  const std::vector<Token>& tokens_;
  const TemplateOptions& options_;
  const std::string& origin_;
  size_t pos_ = 0;
  int block_depth_ = 0;
  int loop_depth_ = 0;
  std::vector<std::string> open_blocks_;
};

}  // namespace

Body parse_template(const std::vector<Token>& tokens, const TemplateOptions& options, const std::string& origin) {
  return Parser(tokens, options, origin).parse();
}

}  // namespace ktune::jinja
