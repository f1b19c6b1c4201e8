// How the hub layer reads its environment: a lookup (std::getenv, or a test's map), so that the
// S3 options, the AWS profile choice and the initializers' settings are read the same way.
#pragma once

#include <functional>
#include <string>

namespace ktune::hub {

using EnvLookup = std::function<const char*(const char*)>;

// The variable's value; "" when it is unset.
inline std::string env_value(const EnvLookup& env, const char* name) {
  const char* v = env(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace ktune::hub
