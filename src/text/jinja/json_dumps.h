// Python's json.dumps over the engine's values, byte for byte: what both dialects' tojson filters
// are built on (jinja2's: sort_keys and ensure_ascii, then made HTML-safe; transformers': no
// sorting, ensure_ascii=False, indent and separators from the template).
#pragma once

#include <optional>
#include <string>

#include "text/jinja/value.h"

namespace ktune::jinja {

struct JsonDumpOptions {
  bool ensure_ascii = true;
  std::optional<std::string> indent;  // nullopt: one line; "": newlines without indentation
  std::optional<std::string> item_separator;  // default ", " on one line, "," with indent
  std::string key_separator = ": ";
  bool sort_keys = false;
};

// Raises TypeError "Object of type X is not JSON serializable" for an Undefined, a namespace, a
// callable.
std::string json_dumps(const Value& value, const JsonDumpOptions& options);

// jinja2's htmlsafe_json_dumps after json.dumps: < > & ' as \u003c \u003e \u0026 \u0027.
std::string html_safe_json(std::string json);

}  // namespace ktune::jinja
