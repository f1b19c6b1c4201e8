// Python's arithmetic on values, with 64-bit integers that raise OverflowError where Python's
// would grow.
#include "text/jinja/operators.h"

#include <cmath>
#include <cctype>
#include <cstdio>

#include "text/jinja/builtins.h"
#include "text/jinja/template_error.h"

namespace ktune::jinja {

namespace {

[[noreturn]] void overflow() { fail("OverflowError: integer result does not fit in 64 bits"); }
// Python's messages: "division by zero" (int /), "float division by zero" (float /),
// "integer division or modulo by zero" (int // %), "float floor division by zero", "float modulo".
[[noreturn]] void zero_division(const char* message = "division by zero") { fail(std::string("ZeroDivisionError: ") + message); }

[[noreturn]] void unsupported(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kAdd && a.is_string() && !b.is_string())
    type_error("can only concatenate str (not \"" + type_name(b) + "\") to str");
  if (op == BinaryOp::kAdd && a.is_list() && !a.is_tuple() && !b.is_list())
    type_error("can only concatenate list (not \"" + type_name(b) + "\") to list");
  std::string symbol = op == BinaryOp::kPow ? "** or pow()" : binary_op_symbol(op);
  type_error("unsupported operand type(s) for " + symbol + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value repeat(const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    if (times > 0 && seq.as_string().size() > (size_t(1) << 30) / size_t(times)) fail("MemoryError: string too long");
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(out) : Value::string(out);
  }
  const std::vector<Value>& items = seq.list().items;
  if (times > 0 && items.size() > (size_t(1) << 24) / size_t(times)) fail("MemoryError: list too long");
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.is_tuple() ? Value::new_tuple(out) : Value::new_list(out);
}

// CPython's float_divmod: floor division and modulo that agree with each other.
void float_divmod(double x, double y, double* floordiv, double* mod, bool want_mod) {
  if (y == 0) zero_division(want_mod ? "float modulo" : "float floor division by zero");
  double m = std::fmod(x, y);
  double div = (x - m) / y;
  if (m != 0) {
    if ((y < 0) != (m < 0)) {
      m += y;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, y);
  }
  double fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, x / y);
  }
  *floordiv = fd;
  *mod = m;
}

Value int_pow(int64_t base, int64_t exponent) {
  if (exponent < 0) {
    if (base == 0) fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
    return Value::number(std::pow(double(base), double(exponent)));
  }
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1)
      if (__builtin_mul_overflow(result, base, &result)) overflow();
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
  }
  return Value::integer(result);
}

Value arithmetic(BinaryOp op, const Value& a, const Value& b) {
  if (!a.is_float() && !b.is_float()) {
    int64_t x = a.as_int(), y = b.as_int(), r = 0;
    switch (op) {
      case BinaryOp::kAdd: if (__builtin_add_overflow(x, y, &r)) overflow(); return Value::integer(r);
      case BinaryOp::kSub: if (__builtin_sub_overflow(x, y, &r)) overflow(); return Value::integer(r);
      case BinaryOp::kMul: if (__builtin_mul_overflow(x, y, &r)) overflow(); return Value::integer(r);
      case BinaryOp::kDiv:
        if (y == 0) zero_division();
        return Value::number(double(x) / double(y));
      case BinaryOp::kFloorDiv:
      case BinaryOp::kMod: {
        if (y == 0) zero_division("integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
          if (op == BinaryOp::kMod) return Value::integer(0);
          overflow();
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          m += y;
          q -= 1;
        }
        return Value::integer(op == BinaryOp::kFloorDiv ? q : m);
      }
      case BinaryOp::kPow: return int_pow(x, y);
    }
  }
  double x = a.as_float(), y = b.as_float();
  switch (op) {
    case BinaryOp::kAdd: return Value::number(x + y);
    case BinaryOp::kSub: return Value::number(x - y);
    case BinaryOp::kMul: return Value::number(x * y);
    case BinaryOp::kDiv:
      if (y == 0) zero_division("float division by zero");
      return Value::number(x / y);
    case BinaryOp::kFloorDiv:
    case BinaryOp::kMod: {
      double fd, m;
      float_divmod(x, y, &fd, &m, op == BinaryOp::kMod);
      return Value::number(op == BinaryOp::kFloorDiv ? fd : m);
    }
    case BinaryOp::kPow:
      if (x == 0 && y < 0) fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
  }
  return Value::none();
}

}  // namespace

const char* binary_op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSub: return "-";
    case BinaryOp::kMul: return "*";
    case BinaryOp::kDiv: return "/";
    case BinaryOp::kFloorDiv: return "//";
    case BinaryOp::kMod: return "%";
    case BinaryOp::kPow: return "**";
  }
  return "?";
}

Value binary_op(BinaryOp op, const Value& a, const Value& b) {
  if (a.is_undefined()) a.fail_undefined();
  if (b.is_undefined()) b.fail_undefined();
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == BinaryOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      // markupsafe: Markup + str escapes the str, and so does str + Markup.
      if (a.is_markup() || b.is_markup())
        return Value::markup((a.is_markup() ? a.as_string() : html_escape(a.as_string())) +
                             (b.is_markup() ? b.as_string() : html_escape(b.as_string())));
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      std::vector<Value> out = a.list().items;
      out.insert(out.end(), b.list().items.begin(), b.list().items.end());
      return a.is_tuple() ? Value::new_tuple(out) : Value::new_list(out);
    }
  }
  if (op == BinaryOp::kMul) {
    if ((a.is_string() || a.is_list()) && b.is_number() && !b.is_float()) return repeat(a, b.as_int());
    if ((b.is_string() || b.is_list()) && a.is_number() && !a.is_float()) return repeat(b, a.as_int());
  }
  if (op == BinaryOp::kMod && a.is_string()) return Value::string(percent_format(a.as_string(), b));
  unsupported(op, a, b);
}

Value negate(const Value& v) {
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_float()) return Value::number(-v.as_float());
  if (v.is_number()) {
    if (v.as_int() == INT64_MIN) overflow();
    return Value::integer(-v.as_int());
  }
  type_error("bad operand type for unary -: '" + type_name(v) + "'");
}

Value unary_plus(const Value& v) {
  if (v.is_undefined()) v.fail_undefined();
  if (v.is_float()) return v;
  if (v.is_number()) return Value::integer(v.as_int());
  type_error("bad operand type for unary +: '" + type_name(v) + "'");
}

std::string percent_format(const std::string& format, const Value& args) {
  std::vector<Value> values;
  if (args.is_tuple()) values = args.list().items;
  else if (!args.is_dict()) values.push_back(args);
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) fail("ValueError: incomplete format");
    const Value* arg = nullptr;
    if (format[i] == '(') {
      size_t close = format.find(')', i);
      if (close == std::string::npos || !args.is_dict()) fail("TypeError: format requires a mapping");
      arg = args.dict().find(Value::string(format.substr(i + 1, close - i - 1)));
      if (!arg) fail("KeyError: '" + format.substr(i + 1, close - i - 1) + "'");
      i = close + 1;
    }
    std::string spec = "%";
    while (i < format.size() && std::string("-+ #0").find(format[i]) != std::string::npos) spec += format[i++];
    while (i < format.size() && (std::isdigit((unsigned char)format[i]) || format[i] == '.')) spec += format[i++];
    if (i >= format.size()) fail("ValueError: incomplete format");
    char conv = format[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!arg) {
      if (next >= values.size()) type_error("not enough arguments for format string");
      arg = &values[next++];
    }
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        std::string text = conv == 's' ? to_str(*arg) : repr(*arg);
        std::string padded = text;
        if (spec != "%") {  // width and precision apply to the text (byte-wise, as printf does)
          std::vector<char> big(text.size() + 256);
          std::snprintf(big.data(), big.size(), (spec + "s").c_str(), text.c_str());
          padded = big.data();
        }
        out += padded;
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        if (!arg->is_number()) type_error(std::string("%") + conv + " format: a real number is required, not " + type_name(*arg));
        {
          long long n = arg->is_float() ? (long long)std::trunc(arg->as_float()) : (long long)arg->as_int();
          std::snprintf(buf, sizeof buf, (spec + "ll" + (conv == 'i' ? 'd' : conv)).c_str(), n);
        }
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg->is_number()) type_error("must be real number, not " + type_name(*arg));
        std::snprintf(buf, sizeof buf, (spec + conv).c_str(), arg->as_float());
        out += buf;
        break;
      case 'c':
        out += arg->is_string() ? arg->as_string() : std::string(1, char(arg->as_int()));
        break;
      default: fail(std::string("ValueError: unsupported format character '") + conv + "'");
    }
  }
  if (next < values.size() && !args.is_dict()) type_error("not all arguments converted during string formatting");
  return out;
}

}  // namespace ktune::jinja
