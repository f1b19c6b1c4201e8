// Which Jinja environment a template is rendered as: the two that Hugging Face chat templates meet.
//   kJinja2        a plain jinja2.Environment() (torchtune's HuggingFaceModelTokenizer): no
//                  trim_blocks or lstrip_blocks, jinja2's HTML-safe tojson, no loop controls,
//                  lists and dicts mutable through their methods.
//   kTransformers  transformers' apply_chat_template (_compile_jinja_template): an
//                  ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks, loopcontrols and
//                  {% generation %}; its own tojson (json.dumps, ensure_ascii=False); the
//                  strftime_now global; list and dict mutation refused by the sandbox.
// Both have the raise_exception global. strict_undefined selects jinja2.StrictUndefined.
#pragma once

namespace ktune::jinja {

enum class Dialect { kJinja2, kTransformers };

struct TemplateOptions {
  Dialect dialect = Dialect::kJinja2;
  bool strict_undefined = false;
};

}  // namespace ktune::jinja
