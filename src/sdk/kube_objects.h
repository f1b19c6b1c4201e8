// Reading and building Kubernetes objects. A field of an object the API server returns may be
// absent, null or of another type than the schema says, and a reader wants "nothing there", not
// an exception.
#pragma once

#include <map>
#include <string>

#include "core/log.h"
#include "runtime/v1alpha1.h"

namespace ktune::sdk {

// obj[key], or a null when obj is not an object or has no such key.
inline const v1alpha1::Json& json_field(const v1alpha1::Json& obj, const char* key) {
  static const v1alpha1::Json null;
  return obj.is_object() && obj.contains(key) ? obj[key] : null;
}

// obj[key] as text: a string as it is, "" when absent or null, anything else as its JSON.
inline std::string json_text(const v1alpha1::Json& obj, const char* key) {
  const v1alpha1::Json& v = json_field(obj, key);
  if (v.is_null()) return "";
  return v.is_string() ? v.get<std::string>() : v.dump();
}

// The Opaque Secret `name` that holds a TrainJob's credentials (a job's or an export's), labelled
// with the TrainJob's name. Its values are registered as secrets first, so no log line shows them.
inline v1alpha1::Json credentials_secret(const std::string& name, const std::string& kubernetes_namespace,
                                         const std::string& trainjob, const std::map<std::string, std::string>& data) {
  v1alpha1::Json secret = {
      {"apiVersion", "v1"},
      {"kind", "Secret"},
      {"metadata",
       {{"name", name},
        {"namespace", kubernetes_namespace},
        {"labels", {{"app.kubernetes.io/managed-by", "ktune"}, {"trainer.kubeflow.org/trainjob-name", trainjob}}}}},
      {"type", "Opaque"},
      {"stringData", v1alpha1::Json::object()}};
  for (const auto& [key, value] : data) {
    register_secret(value);
    secret["stringData"][key] = value;
  }
  return secret;
}

}  // namespace ktune::sdk
