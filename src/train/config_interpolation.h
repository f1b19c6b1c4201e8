// OmegaConf-style `${…}` interpolation in a config tree, resolved once, after the overrides:
//   ${output_dir}          the value of the top-level key (a string that is only an interpolation
//                          takes the referenced value with its type: `${batch_size}` stays an int)
//   ${a.b}/logs            embedded in text: the value converted to text as Python's str() would
//                          (True, None, 0.0003), so paths come out as in torchtune
//   ${.sibling} ${..x}     relative to the map holding the string (one dot per level up)
//   ${a.x[1].y}            list items by index (the same as ${a.x.1.y}); spaces inside ${ } are ignored
//   ${oc.env:NAME} ${oc.env:NAME,default}   an environment variable: a string, as OmegaConf's (the
//                          default too: ${oc.env:N,5} is '5'; null stays None)
//   ${oc.select:key} ${oc.select:key,default}   the key's value, or the default (None) when it is absent
//   \${x}                  a literal "${x}"
// A missing key, a cycle (a → b → a), an unknown resolver or a list/map embedded in text is an
// error naming the key that holds the interpolation; all of them are reported together.
// It does not support nested interpolations (${a.${b}}) or custom resolvers.
#pragma once

#include "train/config.h"

namespace ktune::train {

// Replaces every interpolation in `tree` by its value; throws ktune::Errors.
void resolve_interpolations(ConfigNode& tree);

// Whether a string holds an unescaped "${".
bool has_interpolation(const std::string& text);

// Python's str() of a scalar: True/False, None, 3, 0.0003, 1e-05, 2.0, the string itself.
std::string python_str(const ConfigNode& scalar);

}  // namespace ktune::train
