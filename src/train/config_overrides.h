// torchtune's command-line override grammar, applied to a config tree:
//   a.b.c=value        set (intermediate maps are created); the value is typed as YAML types it
//   key=[x,y]          a list (YAML flow syntax; Python list literals with quotes work too)
//   key={'a': 'b'}     a map (YAML flow syntax, which Python dict literals are); merged key by key
//                      into an existing map, as OmegaConf.merge does
//   key=None           null (torchtune maps Python's None to YAML null); True/False are YAML bools
//   model=<path>       where `model` is a component (a map with `_component_`), sets
//                      model._component_ and keeps the sibling keys, as torchtune does
//   ~a.b               deletes the key; maps left empty are deleted too; deleting a component
//                      (or its `_component_`) is refused, as in torchtune
// Differences from torchtune, all more lenient: a value may contain '=' (split at the first one);
// the component rule applies at any depth, not only to top-level keys; a value that is neither a
// flow collection nor quoted is one scalar (`a=x: y` is the string "x: y", not a map).
// It does not resolve `${…}` (config_interpolation.h does, after all overrides).
#pragma once

#include <string>
#include <vector>

#include "train/config.h"

namespace ktune::train {

struct ConfigOverride {
  enum class Op { Set, Delete };
  Op op = Op::Set;
  std::string key;    // dotted path
  ConfigNode value;   // for Set
  std::string text;   // the argument as given, for messages
};

// Parses one `key=value` or `~key` argument; throws ktune::Error naming the argument.
ConfigOverride parse_override(const std::string& arg);

// Types the right-hand side of an override (see the grammar above); `key` is for messages.
ConfigNode parse_override_value(const std::string& raw, const std::string& key);

// Applies the arguments in order. Every bad argument is reported together (ktune::Errors);
// the good ones are still applied, so that later validation can report its own problems too.
void apply_overrides(ConfigNode& tree, const std::vector<std::string>& args);

}  // namespace ktune::train
