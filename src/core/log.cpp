#include "core/log.h"

#include <cstdio>
#include <mutex>
#include <regex>
#include <vector>

#include "core/utf8.h"

namespace ktune {

static LogLevel g_level = LogLevel::Info;
static std::string g_prefix;
static std::mutex g_mutex;
static std::vector<std::string> g_secrets;

void set_log_level(LogLevel level) { g_level = level; }
void set_log_prefix(const std::string& prefix) { g_prefix = prefix; }

void register_secret(const std::string& secret) {
  if (secret.size() < 4) return;  // too short to redact without mangling ordinary text
  std::lock_guard<std::mutex> lock(g_mutex);
  g_secrets.push_back(secret);
}

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const unsigned char b = static_cast<unsigned char>(text[i]);
    int bad = 0;
    const size_t n = size_t(utf8_well_formed_length(text, i, &bad));
    if (n > 0 && (b >= 0x20 || b == '\n' || b == '\t') && b != 0x7F) {
      out.append(text, i, n);
      i += n;
      continue;
    }
    char escaped[5];
    std::snprintf(escaped, sizeof escaped, "\\x%02X", b);
    out += escaped;
    ++i;
  }
  return out;
}

std::string redact(const std::string& text) {
  std::string out = text;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    for (const std::string& s : g_secrets) {
      for (size_t at = out.find(s); at != std::string::npos; at = out.find(s, at + 3)) out.replace(at, s.size(), "***");
    }
  }
  // A Hugging Face token: "hf_" and ~34 letters/digits, standing alone (not the tail of a name such
  // as ktune.models.hf_tokenizer).
  static const std::regex hf_token(R"((^|[^A-Za-z0-9_.])hf_[A-Za-z0-9]{20,})");
  static const std::regex bearer(R"((Bearer|bearer)\s+[A-Za-z0-9._~+/=-]+)");
  static const std::regex authorization(R"((Authorization|authorization):\s*[^\r\n]+)");
  static const std::regex aws_secret(R"((aws_secret_access_key|AWS_SECRET_ACCESS_KEY|ACCESS_TOKEN)(\s*[=:]\s*)\S+)");
  out = std::regex_replace(out, hf_token, "$1***");
  out = std::regex_replace(out, authorization, "$1: ***");
  out = std::regex_replace(out, bearer, "$1 ***");
  out = std::regex_replace(out, aws_secret, "$1$2***");
  return out;
}

void log(LogLevel level, const std::string& message) {
  if (level < g_level) return;
  static const char* names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
  std::string line = redact(message);
  std::lock_guard<std::mutex> lock(g_mutex);
  std::fprintf(stderr, "%s%s: %s\n", g_prefix.c_str(), names[int(level)], line.c_str());
}

}  // namespace ktune
