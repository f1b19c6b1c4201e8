// RFC 3339 timestamps ("2026-12-02T13:10:00Z"), as Kubernetes objects, pod logs and the trainer's
// status reports carry them, and as the CLI prints times.
#pragma once

#include <cstdint>
#include <string>

namespace ktune {

// Unix seconds → "2026-12-02T13:10:00Z" (UTC, the second rounded down).
std::string format_rfc3339(int64_t unix_seconds);

// "2026-12-02T13:10:00Z" (fractional seconds and a ±hh:mm offset allowed) → unix seconds;
// 0 when malformed.
double parse_rfc3339(const std::string& text);

// The same to the nanosecond (a log line's "2026-12-02T13:10:00.123456789Z"), strictly: -1 when
// malformed or followed by anything.
int64_t parse_rfc3339_ns(const std::string& text);

}  // namespace ktune
