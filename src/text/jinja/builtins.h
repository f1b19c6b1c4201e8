// jinja2's builtins as the two dialects have them: filters (`x | f(args)`), tests (`x is t`),
// the methods of str, list and dict (`s.strip()`), attribute and item lookup with jinja2's rules
// (getattr then getitem for `x.a`, getitem then getattr for `x['a']`), and the globals (range,
// namespace, dict, raise_exception, strftime_now).
// Deliberately not here: the template's own variables and macros (renderer.h).
#pragma once

#include <string>
#include <string_view>

#include "text/jinja/template_options.h"
#include "text/jinja/value.h"

namespace ktune::jinja {

bool has_filter(std::string_view name);
bool has_test(std::string_view name);

// subject | name(args). Raises EvalFault on a bad argument.
Value apply_filter(Renderer& renderer, std::string_view name, const Value& subject, const CallArgs& args);
// subject is name(args)
bool apply_test(Renderer& renderer, std::string_view name, const Value& subject, const CallArgs& args);

// x.name: the attribute (a bound method, a namespace's or loop's attribute) or else the item.
Value get_attribute(Renderer& renderer, const Value& object, const std::string& name);
// x[key]: the item, or else the attribute named by a string key.
Value get_item(Renderer& renderer, const Value& object, const Value& key);
// x[start:stop:step]; null pointers for the parts left out.
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);

// The globals every template sees, for the dialect: a name → callable, or nullptr.
const Value* find_global(Dialect dialect, std::string_view name);

// The HTML escaping of markupsafe.escape: & < > ' " → entities.
std::string html_escape(std::string_view s);

}  // namespace ktune::jinja
