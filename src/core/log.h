// Logging to stderr with a level and an optional rank prefix ("[rank1] "), and the redaction
// that keeps secrets (HF tokens, bearer tokens, AWS keys) out of every line ktune prints or stores.
#pragma once

#include <string>

namespace ktune {

enum class LogLevel { Debug, Info, Warn, Error };

void set_log_level(LogLevel level);
void set_log_prefix(const std::string& prefix);  // e.g. "[rank1] "
void log(LogLevel level, const std::string& message);
inline void log_info(const std::string& m) { log(LogLevel::Info, m); }
inline void log_warn(const std::string& m) { log(LogLevel::Warn, m); }
inline void log_debug(const std::string& m) { log(LogLevel::Debug, m); }

// Registers a secret value: every later log line, and redact(), replaces it with "***".
void register_secret(const std::string& secret);
// Replaces registered secrets and anything shaped like a token (hf_…, "Bearer …",
// "Authorization: …", AWS secret keys after "aws_secret_access_key=") with "***".
std::string redact(const std::string& text);
// The text safe to print on a terminal: valid UTF-8 (file names, CJK, emoji) and newlines and tabs
// kept, any other byte (a control character, a byte of no valid UTF-8 sequence: a damaged file's
// bytes quoted in an error) written as \xHH.
std::string printable(const std::string& text);

}  // namespace ktune
