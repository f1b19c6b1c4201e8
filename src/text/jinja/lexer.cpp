// Jinja2's lexer (jinja2/lexer.py, Lexer.tokeniter) as a hand-written scanner: the same rules in the
// same order, so that whitespace control and trim/lstrip behave byte for byte as jinja2's regexes.
#include "text/jinja/lexer.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "text/jinja/python_str.h"
#include "text/jinja/template_error.h"
#include "text/unicode_text.h"

namespace ktune::jinja {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Operators, longest first (jinja2 sorts them by length for its alternation).
const char* const kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")",  "{",  "}",  ">",  "<",  "=",  ".", ":", "|", ",", ";"};

class Lexer {
 public:
  Lexer(std::string source, const LexerOptions& options, const std::string& origin)
      : src_(std::move(source)), options_(options), origin_(origin) {}

  std::vector<Token> run();

 private:
  // Moves the cursor to byte offset to, keeping line and column.
  void advance_to(size_t to) {
    for (; cursor_ < to; ++cursor_) {
      unsigned char c = (unsigned char)src_[cursor_];
      if (c == '\n') {
        ++line_;
        column_ = 1;
      } else if ((c & 0xC0) != 0x80) {
        ++column_;
      }
    }
  }
  Token make(TokenType type, size_t at) {
    advance_to(at);
    Token t;
    t.type = type;
    t.line = line_;
    t.column = column_;
    return t;
  }
  [[noreturn]] void error(size_t at, const std::string& message) {
    advance_to(at);
    syntax_error(origin_, line_, column_, message);
  }
  bool starts_with(size_t at, const char* s) const { return src_.compare(at, std::strlen(s), s) == 0; }
  // The end of the whitespace run (Python's \s) starting at at.
  size_t skip_space(size_t at) const {
    while (at < src_.size()) {
      char32_t cp;
      int n = text::utf8_decode(src_, at, &cp);
      if (!is_python_space(cp)) break;
      at += size_t(n);
    }
    return at;
  }
  bool all_space(std::string_view s) const {
    std::string copy(s);
    return !s.empty() && py_strip(copy, std::nullopt, true, false).empty();
  }
  // Applies `-` / lstrip_blocks to the data before a tag (jinja2's OptionalLStrip).
  std::string strip_before_tag(std::string text, char sign, bool is_variable) const;
  void emit_data(std::string text, size_t at) {
    if (text.empty()) return;
    Token t = make(TokenType::kData, at);
    t.value = std::move(text);
    tokens_.push_back(std::move(t));
  }
  // If a `{% raw %}` opener starts at at, its end offset.
  std::optional<size_t> match_raw_begin(size_t at) const;
  size_t lex_comment(size_t at);
  size_t lex_raw(size_t at);
  size_t lex_tag(size_t at, bool is_block);
  size_t lex_string(size_t at, Token& token);
  // The end of a float literal at at (jinja2's float_re), or at when none.
  size_t match_float(size_t at) const;
  size_t match_integer(size_t at, Token& token);

  std::string src_;
  LexerOptions options_;
  const std::string& origin_;
  std::vector<Token> tokens_;
  size_t cursor_ = 0;
  int line_ = 1;
  int column_ = 1;
  bool line_starting_ = true;  // the previous match ended with a newline
};

std::string Lexer::strip_before_tag(std::string text, char sign, bool is_variable) const {
  if (sign == '-') return py_strip(text, std::nullopt, false, true);
  if (sign == '+' || !options_.lstrip_blocks || is_variable) return text;
  size_t l_pos = text.rfind('\n');
  l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
  if ((l_pos > 0 || line_starting_) && all_space(std::string_view(text).substr(l_pos))) text.resize(l_pos);
  return text;
}

std::optional<size_t> Lexer::match_raw_begin(size_t at) const {
  size_t p = at + 2;
  if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
  p = skip_space(p);
  if (!starts_with(p, "raw")) return std::nullopt;
  p = skip_space(p + 3);
  if (starts_with(p, "-%}")) return skip_space(p + 3);
  if (starts_with(p, "%}")) return p + 2;
  return std::nullopt;
}

std::vector<Token> Lexer::run() {
  size_t pos = 0;
  while (pos < src_.size()) {
    size_t tag = pos;
    char kind = 0;
    for (; tag + 1 < src_.size(); ++tag) {
      if (src_[tag] == '{' && (src_[tag + 1] == '{' || src_[tag + 1] == '%' || src_[tag + 1] == '#')) {
        kind = src_[tag + 1];
        break;
      }
    }
    if (!kind) {
      emit_data(src_.substr(pos), pos);
      break;
    }
    char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    emit_data(strip_before_tag(src_.substr(pos, tag - pos), sign, kind == '{'), pos);
    line_starting_ = false;
    if (kind == '%') {
      if (std::optional<size_t> raw_end = match_raw_begin(tag)) {
        line_starting_ = src_[*raw_end - 1] == '\n';
        pos = lex_raw(*raw_end);
        continue;
      }
    }
    size_t after = tag + 2 + (sign ? 1 : 0);
    if (kind == '#') pos = lex_comment(after);
    else pos = lex_tag(after, kind == '%');
  }
  tokens_.push_back(make(TokenType::kEof, src_.size()));
  return std::move(tokens_);
}

size_t Lexer::lex_comment(size_t at) {
  for (size_t p = at; p < src_.size(); ++p) {
    size_t end = 0;
    if (starts_with(p, "+#}")) end = p + 3;
    else if (starts_with(p, "-#}")) end = skip_space(p + 3);
    else if (starts_with(p, "#}")) end = p + 2 + (options_.trim_blocks && starts_with(p + 2, "\n") ? 1 : 0);
    if (end) {
      line_starting_ = src_[end - 1] == '\n';
      return end;
    }
  }
  error(at, "Missing end of comment tag");
}

size_t Lexer::lex_raw(size_t at) {
  for (size_t p = at; p + 1 < src_.size(); ++p) {
    if (!starts_with(p, "{%")) continue;
    size_t q = p + 2;
    char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q] : 0;
    if (sign) ++q;
    q = skip_space(q);
    if (!starts_with(q, "endraw")) continue;
    q = skip_space(q + 6);
    size_t end = 0;
    if (starts_with(q, "+%}")) end = q + 3;
    else if (starts_with(q, "-%}")) end = skip_space(q + 3);
    else if (starts_with(q, "%}")) end = q + 2 + (options_.trim_blocks && starts_with(q + 2, "\n") ? 1 : 0);
    if (!end) continue;
    emit_data(strip_before_tag(src_.substr(at, p - at), sign, false), at);
    line_starting_ = src_[end - 1] == '\n';
    return end;
  }
  error(at, "Missing end of raw directive");
}

size_t Lexer::match_float(size_t at) const {
  if (at > 0 && src_[at - 1] == '.') return at;
  auto digits = [&](size_t p) {  // (\d+_)*\d+ : the end, or p when none
    size_t q = p;
    while (true) {
      size_t r = q;
      while (r < src_.size() && is_digit(src_[r])) ++r;
      if (r == q) return q == p ? p : q - 1;  // a trailing '_' is not part of it
      q = r;
      if (q < src_.size() && src_[q] == '_' && q + 1 < src_.size() && is_digit(src_[q + 1])) ++q;
      else return q;
    }
  };
  size_t p = digits(at);
  if (p == at) return at;
  size_t frac_end = p;
  if (p < src_.size() && src_[p] == '.') {
    size_t f = digits(p + 1);
    if (f > p + 1) frac_end = f;
  }
  if (frac_end < src_.size() && (src_[frac_end] == 'e' || src_[frac_end] == 'E')) {
    size_t e = frac_end + 1;
    if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
    size_t x = digits(e);
    if (x > e) return x;
  }
  return frac_end > p ? frac_end : at;
}

size_t Lexer::match_integer(size_t at, Token& token) {
  std::string digits;
  size_t p = at;
  int base = 10;
  auto is_base_digit = [&](char c) {
    if (base == 2) return c == '0' || c == '1';
    if (base == 8) return c >= '0' && c <= '7';
    if (base == 16) return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    return is_digit(c);
  };
  if (src_[p] == '0' && p + 1 < src_.size() && std::strchr("bBoOxX", src_[p + 1])) {
    char b = char(src_[p + 1] | 0x20);
    base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
    p += 2;
  } else if (src_[p] == '0') {
    // 0(_?0)*
    ++p;
    while (p + 1 < src_.size() && src_[p] == '_' && src_[p + 1] == '0') p += 2;
    while (p < src_.size() && src_[p] == '0') ++p;
    token.int_value = 0;
    return p;
  }
  while (p < src_.size()) {
    if (src_[p] == '_' && p + 1 < src_.size() && is_base_digit(src_[p + 1])) ++p;
    if (!is_base_digit(src_[p])) break;
    digits += src_[p++];
  }
  if (digits.empty()) {  // "0x" with no digits: jinja2 reads the "0" alone
    token.int_value = 0;
    return at + 1;
  }
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, base);
  if (errno == ERANGE || v > uint64_t(INT64_MAX)) error(at, "integer literal too large (ktune's Jinja integers are 64-bit)");
  token.int_value = int64_t(v);
  return p;
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view body, bool* ok) {
  std::string out;
  *ok = true;
  auto hex = [&](size_t at, int n, uint32_t* v) {
    if (at + size_t(n) > body.size()) return false;
    *v = 0;
    for (int k = 0; k < n; ++k) {
      char c = body[at + size_t(k)];
      int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      *v = *v * 16 + uint32_t(d);
    }
    return true;
  };
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    uint32_t v = 0;
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x':
        if (!hex(i + 1, 2, &v)) { *ok = false; return out; }
        text::utf8_append(out, v);
        i += 2;
        break;
      case 'u':
      case 'U': {
        int n = e == 'u' ? 4 : 8;
        if (!hex(i + 1, n, &v) || v > 0x10FFFF) { *ok = false; return out; }
        i += size_t(n);
        uint32_t low = 0;
        if (v >= 0xD800 && v <= 0xDBFF && i + 6 < body.size() && body[i + 1] == '\\' && body[i + 2] == 'u' &&
            hex(i + 3, 4, &low) && low >= 0xDC00 && low <= 0xDFFF) {
          v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
          i += 6;
        }
        text::utf8_append(out, v);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          v = uint32_t(e - '0');
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7'; ++k)
            v = v * 8 + uint32_t(body[++i] - '0');
          text::utf8_append(out, v);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

size_t Lexer::lex_string(size_t at, Token& token) {
  char quote = src_[at];
  size_t p = at + 1;
  while (p < src_.size() && src_[p] != quote) p += src_[p] == '\\' ? 2 : 1;
  if (p >= src_.size()) error(at, std::string("unexpected char '") + quote + "' (an unterminated string)");
  bool ok;
  token.value = unescape(std::string_view(src_).substr(at + 1, p - at - 1), &ok);
  if (!ok) error(at, "malformed \\x, \\u or \\U escape in a string literal");
  return p + 1;
}

size_t Lexer::lex_tag(size_t at, bool is_block) {
  tokens_.push_back(make(is_block ? TokenType::kBlockBegin : TokenType::kVariableBegin, at));
  std::vector<char> balance;
  size_t p = at;
  while (p < src_.size()) {
    if (balance.empty()) {
      size_t end = 0;
      if (is_block) {
        if (starts_with(p, "+%}")) end = p + 3;
        else if (starts_with(p, "-%}")) end = skip_space(p + 3);
        else if (starts_with(p, "%}")) end = p + 2 + (options_.trim_blocks && starts_with(p + 2, "\n") ? 1 : 0);
      } else {
        if (starts_with(p, "-}}")) end = skip_space(p + 3);
        else if (starts_with(p, "}}")) end = p + 2;
      }
      if (end) {
        tokens_.push_back(make(is_block ? TokenType::kBlockEnd : TokenType::kVariableEnd, p));
        line_starting_ = src_[end - 1] == '\n';
        return end;
      }
    }
    size_t space_end = skip_space(p);
    if (space_end > p) {
      line_starting_ = src_[space_end - 1] == '\n';
      p = space_end;
      continue;
    }
    line_starting_ = false;
    char c = src_[p];
    if (is_digit(c)) {
      size_t f = match_float(p);
      if (f > p) {
        Token t = make(TokenType::kFloat, p);
        std::string text;
        for (size_t i = p; i < f; ++i)
          if (src_[i] != '_') text += src_[i];
        t.float_value = std::strtod(text.c_str(), nullptr);
        t.value = src_.substr(p, f - p);
        tokens_.push_back(std::move(t));
        p = f;
        continue;
      }
      Token t = make(TokenType::kInteger, p);
      size_t e = match_integer(p, t);
      t.value = src_.substr(p, e - p);
      tokens_.push_back(std::move(t));
      p = e;
      continue;
    }
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      Token t = make(TokenType::kName, p);
      t.value = src_.substr(p, e - p);
      tokens_.push_back(std::move(t));
      p = e;
      continue;
    }
    if (c == '\'' || c == '"') {
      Token t = make(TokenType::kString, p);
      p = lex_string(p, t);
      tokens_.push_back(std::move(t));
      continue;
    }
    const char* op = nullptr;
    for (const char* candidate : kOperators)
      if (starts_with(p, candidate)) {
        op = candidate;
        break;
      }
    if (!op) error(p, std::string("unexpected char '") + c + "'");
    std::string o(op);
    if (o == "(" || o == "[" || o == "{") {
      balance.push_back(o == "(" ? ')' : o == "[" ? ']' : '}');
    } else if (o == ")" || o == "]" || o == "}") {
      if (balance.empty()) error(p, "unexpected '" + o + "'");
      if (balance.back() != o[0]) error(p, "unexpected '" + o + "', expected '" + std::string(1, balance.back()) + "'");
      balance.pop_back();
    }
    Token t = make(TokenType::kOperator, p);
    t.value = o;
    tokens_.push_back(std::move(t));
    p += o.size();
  }
  return p;  // the template ended inside the tag: the parser reports it
}

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options, const std::string& origin) {
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  return Lexer(std::move(normalized), options, origin).run();
}

std::string describe_token(const Token& token) {
  switch (token.type) {
    case TokenType::kData: return "template data";
    case TokenType::kVariableBegin: return "begin of print statement";
    case TokenType::kVariableEnd: return "end of print statement";
    case TokenType::kBlockBegin: return "begin of statement block";
    case TokenType::kBlockEnd: return "end of statement block";
    case TokenType::kName: return "'" + token.value + "'";
    case TokenType::kString: return "string";
    case TokenType::kInteger: return "integer";
    case TokenType::kFloat: return "float";
    case TokenType::kOperator: return "'" + token.value + "'";
    case TokenType::kEof: return "end of template";
  }
  return "token";
}

}  // namespace ktune::jinja
