// Python's arithmetic on the engine's values, as a template's + - * / // % ** and unary -, +
// evaluate them: ints and floats mix as Python's do, // and % floor, / is true division, strings and
// lists concatenate and repeat (markupsafe's Markup escapes a plain str added to it), str % args
// formats printf-style. Integers are 64-bit: where
// Python's would grow past that, this raises OverflowError instead.
// Deliberately not here: comparison and `in` (value.h), `~` (the renderer joins str() of each side).
#pragma once

#include <string>

#include "text/jinja/value.h"

namespace ktune::jinja {

enum class BinaryOp { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow };

const char* binary_op_symbol(BinaryOp op);  // "+", "//", ...
Value binary_op(BinaryOp op, const Value& a, const Value& b);
Value negate(const Value& v);     // -v
Value unary_plus(const Value& v);  // +v
// Python's str % args with the conversions templates use: %s %r %d %i %f %e %g %x %o %c %%,
// flags, width and precision; args is a tuple for several values, a dict for %(name)s.
std::string percent_format(const std::string& format, const Value& args);

}  // namespace ktune::jinja
