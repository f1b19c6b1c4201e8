// The parsed template: expressions and statements as the parser builds them and the renderer walks
// them. One struct for each, tagged by kind, with the fields each kind uses named beside it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/operators.h"
#include "text/jinja/value.h"

namespace ktune::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  kConst,     // constant
  kName,      // name
  kList,      // args: the items
  kTuple,     // args: the items
  kDict,      // args: key0, value0, key1, value1, ...
  kGetAttr,   // args: [object]; name: the attribute          (x.name)
  kGetItem,   // args: [object, index]                          (x[i], x[a:b])
  kSlice,     // args: [start, stop, step], each may be null    (only as a kGetItem index)
  kCall,      // args: [callee, positional...]; kwargs
  kFilter,    // args: [subject, positional...]; kwargs; name. A null subject is the body of a
              // {% filter %} or {% set x | f %} block.
  kTest,      // args: [subject, positional...]; kwargs; name; negated for `is not`
  kNeg,       // args: [operand]
  kPos,       // args: [operand]
  kNot,       // args: [operand]
  kBinary,    // args: [lhs, rhs]; op
  kConcat,    // args: operands of ~
  kCompare,   // args: [first, operand for each of compare_ops]
  kAnd,       // args: [lhs, rhs]
  kOr,        // args: [lhs, rhs]
  kCondExpr,  // args: [test, then, otherwise]; otherwise may be null
};

struct Expr {
  ExprKind kind = ExprKind::kConst;
  int line = 0;
  int depth = 1;  // of the tree under this node: the parser refuses trees deeper than kMaxExprDepth
  Value constant;
  std::string name;
  BinaryOp op = BinaryOp::kAdd;
  bool negated = false;
  std::vector<std::string> compare_ops;  // "==", "!=", "<", "<=", ">", ">=", "in", "notin"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

// What a for loop, a set or a with assigns to: a name, a namespace attribute (ns.attr), or a
// tuple of targets to unpack into.
struct Target {
  std::string name;
  std::string attribute;  // set only for ns.attr
  bool is_tuple = false;
  std::vector<Target> items;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  kData,         // text
  kPrint,        // expr
  kIf,           // branches (condition, body) for if and each elif; else_body
  kFor,          // targets[0] in expr [if condition]; body; else_body
  kSet,          // targets[0] = expr
  kSetBlock,     // targets[0] = the rendered body, through filter when not null
  kMacro,        // name(params with defaults); body
  kFilterBlock,  // filter applied to the rendered body
  kWith,         // targets[i] = values[i] in a new scope; body
  kBreak,
  kContinue,
  kGeneration,   // transformers' {% generation %}: renders its body
};

struct Stmt {
  StmtKind kind = StmtKind::kData;
  int line = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr condition;
  ExprPtr filter;
  std::vector<Target> targets;
  std::vector<ExprPtr> values;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // a macro's parameters; null: no default
  Body body;
  Body else_body;
};

}  // namespace ktune::jinja
