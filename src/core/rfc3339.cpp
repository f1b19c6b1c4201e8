#include "core/rfc3339.h"

#include <cstdlib>
#include <cstring>
#include <ctime>

namespace ktune {

namespace {

// "+hh:mm" / "-hh:mm" → seconds east of UTC.
int64_t offset_seconds(const char* offset) {
  const int sign = *offset == '+' ? 1 : -1;
  const int hh = std::atoi(std::string(offset + 1, 2).c_str()), mm = std::atoi(std::string(offset + 4, 2).c_str());
  return int64_t(sign) * (hh * 3600 + mm * 60);
}

}  // namespace

std::string format_rfc3339(int64_t unix_seconds) {
  const std::time_t t = std::time_t(unix_seconds);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double parse_rfc3339(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr) return 0;
  double seconds = double(timegm(&tm));
  if (*rest == '.') {
    char* end = nullptr;
    seconds += std::strtod(rest, &end);
    rest = end;
  }
  if (*rest == 'Z' || *rest == 'z') return seconds;
  if ((*rest == '+' || *rest == '-') && std::strlen(rest) >= 6) return seconds - double(offset_seconds(rest));
  return *rest == '\0' ? seconds : 0;
}

int64_t parse_rfc3339_ns(const std::string& text) {
  std::tm tm{};
  const char* rest = strptime(text.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr || tm.tm_year < 70) return -1;
  int64_t ns = int64_t(timegm(&tm)) * 1000000000;
  if (*rest == '.') {
    int64_t frac = 0;
    int digits = 0;
    for (++rest; *rest >= '0' && *rest <= '9'; ++rest)
      if (digits < 9) frac = frac * 10 + (*rest - '0'), ++digits;
    if (digits == 0) return -1;
    for (; digits < 9; ++digits) frac *= 10;
    ns += frac;
  }
  if ((*rest == 'Z' || *rest == 'z') && rest[1] == '\0') return ns;
  if ((*rest == '+' || *rest == '-') && std::strlen(rest) == 6 && rest[3] == ':')
    return ns - offset_seconds(rest) * 1000000000;
  return -1;
}

}  // namespace ktune
