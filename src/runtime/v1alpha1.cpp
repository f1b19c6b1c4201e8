// Reading and writing the Trainer API objects (see v1alpha1.h for the unknown-field policy).
// Readers walk a JSON tree (YAML is converted first) and name the file and field path of every
// fault; writers emit the fields in the CRD's spelling and omit what is unset, as the Go types'
// `omitempty` does. It does not default anything: defaults are the plugins' business.
#include "runtime/v1alpha1.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "core/error.h"

namespace ktune::v1alpha1 {

namespace {

// Reads an object's fields by name and reports the ones nobody asked for.
class Fields {
 public:
  Fields(const Json& obj, std::string where, std::string path) : obj_(obj), where_(std::move(where)), path_(std::move(path)) {
    if (!obj_.is_object()) throw Error(place(), "must be a mapping, got " + std::string(obj_.type_name()));
  }
  std::string place() const { return path_.empty() ? where_ : where_ + ": " + path_; }
  std::string child(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const Json* get(const std::string& key) {
    known_.insert(key);
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  Json verbatim(const std::string& key) {
    const Json* v = get(key);
    return v ? *v : Json();
  }
  std::optional<std::string> str(const std::string& key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_string()) throw Error(where_ + ": " + child(key), "must be a string, got " + dump(*v));
    return v->get<std::string>();
  }
  std::optional<std::int64_t> integer(const std::string& key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_number_integer()) throw Error(where_ + ": " + child(key), "must be an integer, got " + dump(*v));
    return v->get<std::int64_t>();
  }
  std::optional<bool> boolean(const std::string& key) {
    const Json* v = get(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean()) throw Error(where_ + ": " + child(key), "must be true or false, got " + dump(*v));
    return v->get<bool>();
  }
  std::vector<std::string> strings(const std::string& key) {
    std::vector<std::string> out;
    const Json* v = get(key);
    if (!v) return out;
    if (!v->is_array()) throw Error(where_ + ": " + child(key), "must be a list of strings");
    for (size_t i = 0; i < v->size(); ++i) {
      const Json& e = (*v)[i];
      if (!e.is_string())
        throw Error(where_ + ": " + child(key) + "[" + std::to_string(i) + "]", "must be a string, got " + dump(e));
      out.push_back(e.get<std::string>());
    }
    return out;
  }
  std::map<std::string, std::string> string_map(const std::string& key) {
    std::map<std::string, std::string> out;
    const Json* v = get(key);
    if (!v) return out;
    if (!v->is_object()) throw Error(where_ + ": " + child(key), "must be a mapping of strings");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it.value().is_string())
        throw Error(where_ + ": " + child(key) + "." + it.key(), "must be a string, got " + dump(it.value()));
      out[it.key()] = it.value().get<std::string>();
    }
    return out;
  }
  // Refuses the keys that no get() asked for.
  void refuse_unknown() const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (known_.count(it.key())) continue;
      std::string known;
      for (const std::string& k : known_) known += (known.empty() ? "" : ", ") + k;
      throw Error(where_ + ": " + child(it.key()), "unknown field (known here: " + known + ")");
    }
  }
  const std::string& where() const { return where_; }

  static std::string dump(const Json& v) {
    std::string s = v.dump();
    return s.size() > 60 ? s.substr(0, 57) + "..." : s;
  }

 private:
  const Json& obj_;
  std::string where_;
  std::string path_;
  std::set<std::string> known_;
};

std::string num_proc_from_json(const Json* v, const std::string& where) {
  if (!v) return "";
  if (v->is_number_integer()) return std::to_string(v->get<std::int64_t>());
  if (v->is_string()) return v->get<std::string>();
  throw Error(where, "must be an integer or \"auto\", got " + v->dump());
}

ObjectMeta meta_from_json(const Json* v, const std::string& where, const std::string& path) {
  ObjectMeta m;
  if (!v) return m;
  if (!v->is_object()) throw Error(where + ": " + path, "must be a mapping");
  Fields f(*v, where, path);
  m.name = f.str("name").value_or("");
  m.namespace_ = f.str("namespace").value_or("");
  m.labels = f.string_map("labels");
  m.annotations = f.string_map("annotations");
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (it.key() == "name" || it.key() == "namespace" || it.key() == "labels" || it.key() == "annotations") continue;
    m.extra[it.key()] = it.value();
  }
  return m;
}

Json meta_to_json(const ObjectMeta& m) {
  Json j = Json::object();
  if (!m.name.empty()) j["name"] = m.name;
  if (!m.namespace_.empty()) j["namespace"] = m.namespace_;
  if (!m.labels.empty()) j["labels"] = m.labels;
  if (!m.annotations.empty()) j["annotations"] = m.annotations;
  for (auto it = m.extra.begin(); it != m.extra.end(); ++it) j[it.key()] = it.value();
  return j;
}

std::vector<EnvVar> env_from_json(const Json* v, const std::string& where, const std::string& path) {
  std::vector<EnvVar> out;
  if (!v) return out;
  if (!v->is_array()) throw Error(where + ": " + path, "must be a list of {name, value}");
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    Fields f((*v)[i], where, p);
    EnvVar e;
    auto name = f.str("name");
    if (!name || name->empty()) throw Error(where + ": " + p + ".name", "is required");
    e.name = *name;
    e.value = f.str("value");
    e.value_from = f.verbatim("valueFrom");
    f.refuse_unknown();
    out.push_back(std::move(e));
  }
  return out;
}

Json env_to_json(const std::vector<EnvVar>& env) {
  Json a = Json::array();
  for (const EnvVar& e : env) {
    Json j = Json::object();
    j["name"] = e.name;
    if (e.value) j["value"] = *e.value;
    if (!e.value_from.is_null()) j["valueFrom"] = e.value_from;
    a.push_back(j);
  }
  return a;
}

std::string quantity_from_json(const Json& v, const std::string& where) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number_float()) {
    std::ostringstream s;
    s << v.get<double>();
    return s.str();
  }
  throw Error(where, "must be a quantity (\"2\", \"500m\", \"16Gi\"), got " + v.dump());
}

ResourceRequirements resources_from_json(const Json& v, const std::string& where, const std::string& path) {
  ResourceRequirements r;
  Fields f(v, where, path);
  for (const char* key : {"limits", "requests"}) {
    const Json* m = f.get(key);
    if (!m) continue;
    if (!m->is_object()) throw Error(where + ": " + path + "." + key, "must be a mapping of quantities");
    auto& out = std::string(key) == "limits" ? r.limits : r.requests;
    for (auto it = m->begin(); it != m->end(); ++it)
      out[it.key()] = quantity_from_json(it.value(), where + ": " + path + "." + key + "." + it.key());
  }
  r.claims = f.verbatim("claims");
  f.refuse_unknown();
  return r;
}

// Quantities that are plain integers are written as integers (as upstream manifests write GPUs).
Json quantity_to_json(const std::string& q) {
  static const std::regex integer("^[0-9]+$");
  if (std::regex_match(q, integer) && q.size() < 18) return std::stoll(q);
  return q;
}

Json resources_to_json(const ResourceRequirements& r) {
  Json j = Json::object();
  if (!r.limits.empty()) {
    j["limits"] = Json::object();
    for (const auto& [k, v] : r.limits) j["limits"][k] = quantity_to_json(v);
  }
  if (!r.requests.empty()) {
    j["requests"] = Json::object();
    for (const auto& [k, v] : r.requests) j["requests"][k] = quantity_to_json(v);
  }
  if (!r.claims.is_null()) j["claims"] = r.claims;
  return j;
}

InitializerSpec initializer_spec_from_json(const Json& v, const std::string& where, const std::string& path) {
  Fields f(v, where, path);
  InitializerSpec s;
  s.storage_uri = f.str("storageUri");
  s.env = env_from_json(f.get("env"), where, path + ".env");
  if (const Json* ref = f.get("secretRef")) {
    Fields rf(*ref, where, path + ".secretRef");
    s.secret_ref = rf.str("name").value_or("");
    rf.refuse_unknown();
  }
  f.refuse_unknown();
  return s;
}

Json initializer_spec_to_json(const InitializerSpec& s) {
  Json j = Json::object();
  if (!s.env.empty()) j["env"] = env_to_json(s.env);
  if (s.secret_ref) j["secretRef"] = Json{{"name", *s.secret_ref}};
  if (s.storage_uri) j["storageUri"] = *s.storage_uri;
  return j;
}

void check_type_meta(const Json& doc, const std::string& where, const std::vector<std::string>& kinds) {
  if (!doc.is_object()) throw Error(where, "a Kubernetes object must be a mapping");
  auto api = doc.find("apiVersion");
  if (api == doc.end() || !api->is_string() || api->get<std::string>() != kApiVersion)
    throw Error(where + ": apiVersion", std::string("must be ") + kApiVersion + ", got " +
                                            (api == doc.end() ? "nothing" : api->dump()));
  auto kind = doc.find("kind");
  std::string k = kind != doc.end() && kind->is_string() ? kind->get<std::string>() : "";
  if (std::find(kinds.begin(), kinds.end(), k) == kinds.end()) {
    std::string want;
    for (const auto& x : kinds) want += (want.empty() ? "" : " or ") + x;
    throw Error(where + ": kind", "must be " + want + ", got " + (k.empty() ? "nothing" : k));
  }
}

// ---- YAML <-> JSON ----

bool is_yaml_null(const std::string& s) { return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL"; }
bool is_yaml_bool(const std::string& s, bool* value) {
  if (s == "true" || s == "True" || s == "TRUE") { *value = true; return true; }
  if (s == "false" || s == "False" || s == "FALSE") { *value = false; return true; }
  return false;
}
bool is_yaml_int(const std::string& s) {
  static const std::regex re("^[-+]?[0-9]+$");
  return std::regex_match(s, re) && s.size() < 19;
}
bool is_yaml_float(const std::string& s) {
  static const std::regex re("^[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?$");
  static const std::regex special("^([-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN))$");
  return std::regex_match(s, re) || std::regex_match(s, special);
}

Json yaml_to_json(const YAML::Node& node, const std::string& where) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return Json();
    case YAML::NodeType::Sequence: {
      Json a = Json::array();
      for (const auto& e : node) a.push_back(yaml_to_json(e, where));
      return a;
    }
    case YAML::NodeType::Map: {
      Json o = Json::object();
      for (const auto& kv : node) {
        const std::string key = kv.first.as<std::string>();
        if (o.contains(key)) throw Error(where + ":" + std::to_string(kv.first.Mark().line + 1), "duplicate key " + key);
        o[key] = yaml_to_json(kv.second, where);
      }
      return o;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = node.Scalar();
      if (node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str") return s;  // quoted: a string
      if (is_yaml_null(s)) return Json();
      bool b;
      if (is_yaml_bool(s, &b)) return b;
      if (is_yaml_int(s)) return std::stoll(s);
      if (is_yaml_float(s)) return std::stod(s);
      return s;
    }
  }
  return Json();
}

bool string_needs_quotes(const std::string& s) {
  bool b;
  return is_yaml_null(s) || is_yaml_bool(s, &b) || is_yaml_int(s) || is_yaml_float(s) ||
         s == "yes" || s == "no" || s == "on" || s == "off" || s == "Yes" || s == "No" || s == "y" || s == "n";
}

void emit_json(YAML::Emitter& out, const Json& v) {
  if (v.is_object()) {
    if (v.empty()) {
      out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
      return;
    }
    out << YAML::BeginMap;
    for (auto it = v.begin(); it != v.end(); ++it) {
      out << YAML::Key << it.key() << YAML::Value;
      emit_json(out, it.value());
    }
    out << YAML::EndMap;
  } else if (v.is_array()) {
    if (v.empty()) {
      out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
      return;
    }
    out << YAML::BeginSeq;
    for (const auto& e : v) emit_json(out, e);
    out << YAML::EndSeq;
  } else if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (string_needs_quotes(s))
      out << YAML::DoubleQuoted << s;
    else
      out << s;
  } else if (v.is_boolean()) {
    out << (v.get<bool>() ? "true" : "false");
  } else if (v.is_number_integer()) {
    out << v.get<std::int64_t>();
  } else if (v.is_number_float()) {
    out << v.get<double>();
  } else {
    out << YAML::Null;
  }
}

}  // namespace

// ---- TrainJob ----

TrainJob trainjob_from_json(const Json& doc, const std::string& where) {
  check_type_meta(doc, where, {kTrainJobKind});
  Fields top(doc, where, "");
  top.get("apiVersion");
  top.get("kind");
  TrainJob job;
  job.metadata = meta_from_json(top.get("metadata"), where, "metadata");
  const Json* spec = top.get("spec");
  if (!spec) throw Error(where + ": spec", "is required");
  Fields f(*spec, where, "spec");
  const Json* ref = f.get("runtimeRef");
  if (!ref) throw Error(where + ": spec.runtimeRef", "is required");
  {
    Fields rf(*ref, where, "spec.runtimeRef");
    job.spec.runtime_ref.name = rf.str("name").value_or("");
    job.spec.runtime_ref.api_group = rf.str("apiGroup").value_or(kGroup);
    job.spec.runtime_ref.kind = rf.str("kind").value_or(kClusterTrainingRuntimeKind);
    rf.refuse_unknown();
  }
  if (const Json* init = f.get("initializer")) {
    Fields inf(*init, where, "spec.initializer");
    Initializer i;
    if (const Json* d = inf.get("dataset")) i.dataset = initializer_spec_from_json(*d, where, "spec.initializer.dataset");
    if (const Json* m = inf.get("model")) i.model = initializer_spec_from_json(*m, where, "spec.initializer.model");
    inf.refuse_unknown();
    job.spec.initializer = i;
  }
  if (const Json* tr = f.get("trainer")) {
    Fields tf(*tr, where, "spec.trainer");
    Trainer t;
    t.image = tf.str("image");
    t.command = tf.strings("command");
    t.args = tf.strings("args");
    t.env = env_from_json(tf.get("env"), where, "spec.trainer.env");
    if (auto n = tf.integer("numNodes")) t.num_nodes = static_cast<int>(*n);
    t.num_proc_per_node = num_proc_from_json(tf.get("numProcPerNode"), where + ": spec.trainer.numProcPerNode");
    if (const Json* r = tf.get("resourcesPerNode"))
      t.resources_per_node = resources_from_json(*r, where, "spec.trainer.resourcesPerNode");
    tf.refuse_unknown();
    job.spec.trainer = t;
  }
  job.spec.suspend = f.boolean("suspend");
  job.spec.active_deadline_seconds = f.integer("activeDeadlineSeconds");
  job.spec.managed_by = f.str("managedBy");
  job.spec.labels = f.string_map("labels");
  job.spec.annotations = f.string_map("annotations");
  job.spec.runtime_patches = f.verbatim("runtimePatches");
  job.spec.pod_template_overrides = f.verbatim("podTemplateOverrides");
  f.refuse_unknown();

  if (const Json* st = top.get("status")) {
    Fields sf(*st, where, "status");
    TrainJobStatus s;
    if (const Json* conds = sf.get("conditions")) {
      for (size_t i = 0; i < conds->size(); ++i) {
        Fields cf((*conds)[i], where, "status.conditions[" + std::to_string(i) + "]");
        Condition c;
        c.type = cf.str("type").value_or("");
        c.status = cf.str("status").value_or("");
        c.reason = cf.str("reason").value_or("");
        c.message = cf.str("message").value_or("");
        c.last_transition_time = cf.str("lastTransitionTime").value_or("");
        cf.get("observedGeneration");
        cf.refuse_unknown();
        s.conditions.push_back(c);
      }
    }
    if (const Json* jobs = sf.get("jobsStatus")) {
      for (size_t i = 0; i < jobs->size(); ++i) {
        Fields jf((*jobs)[i], where, "status.jobsStatus[" + std::to_string(i) + "]");
        JobStatus j;
        j.name = jf.str("name").value_or("");
        j.active = static_cast<int>(jf.integer("active").value_or(0));
        j.ready = static_cast<int>(jf.integer("ready").value_or(0));
        j.succeeded = static_cast<int>(jf.integer("succeeded").value_or(0));
        j.failed = static_cast<int>(jf.integer("failed").value_or(0));
        j.suspended = static_cast<int>(jf.integer("suspended").value_or(0));
        jf.refuse_unknown();
        s.jobs_status.push_back(j);
      }
    }
    if (const Json* ts = sf.get("trainerStatus")) {
      Fields tf(*ts, where, "status.trainerStatus");
      TrainerStatus t;
      if (auto p = tf.integer("progressPercentage")) t.progress_percentage = static_cast<int>(*p);
      t.estimated_remaining_seconds = tf.integer("estimatedRemainingSeconds");
      t.last_updated_time = tf.str("lastUpdatedTime").value_or("");
      if (const Json* ms = tf.get("metrics")) {
        for (size_t i = 0; i < ms->size(); ++i) {
          Fields mf((*ms)[i], where, "status.trainerStatus.metrics[" + std::to_string(i) + "]");
          t.metrics.push_back({mf.str("name").value_or(""), mf.str("value").value_or("")});
          mf.refuse_unknown();
        }
      }
      tf.refuse_unknown();
      s.trainer_status = t;
    }
    sf.refuse_unknown();
    job.status = s;
  }
  top.refuse_unknown();
  return job;
}

Json to_json(const TrainJob& job) {
  Json j = Json::object();
  j["apiVersion"] = kApiVersion;
  j["kind"] = kTrainJobKind;
  j["metadata"] = meta_to_json(job.metadata);
  Json spec = Json::object();
  if (job.spec.active_deadline_seconds) spec["activeDeadlineSeconds"] = *job.spec.active_deadline_seconds;
  if (!job.spec.annotations.empty()) spec["annotations"] = job.spec.annotations;
  if (job.spec.initializer) {
    Json i = Json::object();
    if (job.spec.initializer->dataset) i["dataset"] = initializer_spec_to_json(*job.spec.initializer->dataset);
    if (job.spec.initializer->model) i["model"] = initializer_spec_to_json(*job.spec.initializer->model);
    spec["initializer"] = i;
  }
  if (!job.spec.labels.empty()) spec["labels"] = job.spec.labels;
  if (job.spec.managed_by) spec["managedBy"] = *job.spec.managed_by;
  if (!job.spec.pod_template_overrides.is_null()) spec["podTemplateOverrides"] = job.spec.pod_template_overrides;
  if (!job.spec.runtime_patches.is_null()) spec["runtimePatches"] = job.spec.runtime_patches;
  Json ref = Json::object();
  ref["apiGroup"] = job.spec.runtime_ref.api_group;
  ref["kind"] = job.spec.runtime_ref.kind;
  ref["name"] = job.spec.runtime_ref.name;
  spec["runtimeRef"] = ref;
  if (job.spec.suspend) spec["suspend"] = *job.spec.suspend;
  if (job.spec.trainer) {
    const Trainer& t = *job.spec.trainer;
    Json tj = Json::object();
    if (!t.args.empty()) tj["args"] = t.args;
    if (!t.command.empty()) tj["command"] = t.command;
    if (!t.env.empty()) tj["env"] = env_to_json(t.env);
    if (t.image) tj["image"] = *t.image;
    if (t.num_nodes) tj["numNodes"] = *t.num_nodes;
    static const std::regex integer("^[0-9]+$");
    if (std::regex_match(t.num_proc_per_node, integer)) tj["numProcPerNode"] = std::stoi(t.num_proc_per_node);
    if (t.resources_per_node) tj["resourcesPerNode"] = resources_to_json(*t.resources_per_node);
    spec["trainer"] = tj;
  }
  j["spec"] = spec;
  if (job.status) {
    Json s = Json::object();
    if (!job.status->conditions.empty()) {
      s["conditions"] = Json::array();
      for (const Condition& c : job.status->conditions)
        s["conditions"].push_back({{"type", c.type}, {"status", c.status}, {"reason", c.reason},
                                   {"message", c.message}, {"lastTransitionTime", c.last_transition_time}});
    }
    if (!job.status->jobs_status.empty()) {
      s["jobsStatus"] = Json::array();
      for (const JobStatus& js : job.status->jobs_status)
        s["jobsStatus"].push_back({{"name", js.name}, {"active", js.active}, {"ready", js.ready},
                                   {"succeeded", js.succeeded}, {"failed", js.failed}, {"suspended", js.suspended}});
    }
    if (job.status->trainer_status) {
      const TrainerStatus& t = *job.status->trainer_status;
      Json ts = Json::object();
      if (t.estimated_remaining_seconds) ts["estimatedRemainingSeconds"] = *t.estimated_remaining_seconds;
      if (!t.last_updated_time.empty()) ts["lastUpdatedTime"] = t.last_updated_time;
      if (!t.metrics.empty()) {
        ts["metrics"] = Json::array();
        for (const Metric& m : t.metrics) ts["metrics"].push_back({{"name", m.name}, {"value", m.value}});
      }
      if (t.progress_percentage) ts["progressPercentage"] = *t.progress_percentage;
      s["trainerStatus"] = ts;
    }
    j["status"] = s;
  }
  return j;
}

// ---- runtimes ----

const Container* ReplicatedJob::find_container(const std::string& container_name) const {
  for (const Container& c : containers)
    if (c.name == container_name) return &c;
  return nullptr;
}

std::string TrainingRuntime::framework() const {
  auto it = metadata.labels.find(kFrameworkLabel);
  return it == metadata.labels.end() ? "" : it->second;
}

std::vector<ReplicatedJob> TrainingRuntime::replicated_jobs() const {
  std::vector<ReplicatedJob> out;
  const std::string where = "runtime " + metadata.name;
  if (!template_.is_object() || !template_.contains("spec") || !template_["spec"].is_object()) return out;
  const Json& spec = template_["spec"];
  if (!spec.contains("replicatedJobs")) return out;
  const Json& rjobs = spec["replicatedJobs"];
  if (!rjobs.is_array()) throw Error(where + ": spec.template.spec.replicatedJobs", "must be a list");
  for (size_t i = 0; i < rjobs.size(); ++i) {
    const Json& rj = rjobs[i];
    const std::string path = "spec.template.spec.replicatedJobs[" + std::to_string(i) + "]";
    if (!rj.is_object()) throw Error(where + ": " + path, "must be a mapping");
    ReplicatedJob r;
    r.name = rj.value("name", "");
    r.replicas = rj.contains("replicas") && rj["replicas"].is_number_integer() ? rj["replicas"].get<int>() : 1;
    if (rj.contains("dependsOn") && rj["dependsOn"].is_array())
      for (const Json& d : rj["dependsOn"]) r.depends_on.push_back({d.value("name", ""), d.value("status", "")});
    const Json tmpl = rj.value("template", Json::object());
    if (tmpl.contains("metadata") && tmpl["metadata"].is_object() && tmpl["metadata"].contains("labels")) {
      const Json& labels = tmpl["metadata"]["labels"];
      if (labels.is_object() && labels.contains(kAncestorLabel) && labels[kAncestorLabel].is_string())
        r.ancestor = labels[kAncestorLabel].get<std::string>();
    }
    // template.spec.template.spec.containers
    const Json* pod_spec = nullptr;
    if (tmpl.contains("spec") && tmpl["spec"].is_object() && tmpl["spec"].contains("template")) {
      const Json& pt = tmpl["spec"]["template"];
      if (pt.is_object() && pt.contains("spec") && pt["spec"].is_object()) pod_spec = &pt["spec"];
    }
    if (pod_spec && pod_spec->contains("containers") && (*pod_spec)["containers"].is_array()) {
      const Json& cs = (*pod_spec)["containers"];
      for (size_t k = 0; k < cs.size(); ++k) {
        const Json& c = cs[k];
        const std::string cpath = path + ".template.spec.template.spec.containers[" + std::to_string(k) + "]";
        if (!c.is_object()) throw Error(where + ": " + cpath, "must be a mapping");
        Container ct;
        ct.name = c.value("name", "");
        ct.image = c.value("image", "");
        auto strings = [&](const char* key) {
          std::vector<std::string> v;
          if (!c.contains(key)) return v;
          if (!c[key].is_array()) throw Error(where + ": " + cpath + "." + key, "must be a list of strings");
          for (const Json& s : c[key]) {
            if (!s.is_string()) throw Error(where + ": " + cpath + "." + key, "must be a list of strings, got " + s.dump());
            v.push_back(s.get<std::string>());
          }
          return v;
        };
        ct.command = strings("command");
        ct.args = strings("args");
        if (c.contains("env")) ct.env = env_from_json(&c["env"], where, cpath + ".env");
        if (c.contains("resources") && c["resources"].is_object())
          ct.resources = resources_from_json(c["resources"], where, cpath + ".resources");
        if (c.contains("volumeMounts") && c["volumeMounts"].is_array())
          for (const Json& vm : c["volumeMounts"]) ct.volume_mounts.push_back({vm.value("name", ""), vm.value("mountPath", "")});
        r.containers.push_back(std::move(ct));
      }
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::optional<ReplicatedJob> TrainingRuntime::find_replicated_job(const std::string& ancestor) const {
  const std::vector<ReplicatedJob> jobs = replicated_jobs();
  for (const ReplicatedJob& r : jobs)
    if (r.ancestor == ancestor) return r;
  const std::string fallback = ancestor == "trainer" ? "node" : ancestor;
  for (const ReplicatedJob& r : jobs)
    if (r.name == fallback) return r;
  return std::nullopt;
}

TrainingRuntime runtime_from_json(const Json& doc, const std::string& where) {
  check_type_meta(doc, where, {kClusterTrainingRuntimeKind, kTrainingRuntimeKind});
  Fields top(doc, where, "");
  top.get("apiVersion");
  TrainingRuntime rt;
  rt.kind = top.str("kind").value_or("");
  rt.metadata = meta_from_json(top.get("metadata"), where, "metadata");
  if (rt.metadata.name.empty()) throw Error(where + ": metadata.name", "is required");
  const std::string w = where + " (" + rt.metadata.name + ")";
  const Json* spec = top.get("spec");
  if (!spec) throw Error(w + ": spec", "is required");
  Fields f(*spec, w, "spec");
  if (const Json* ml = f.get("mlPolicy")) {
    Fields mf(*ml, w, "spec.mlPolicy");
    if (auto n = mf.integer("numNodes")) rt.ml_policy.num_nodes = static_cast<int>(*n);
    if (const Json* torch = mf.get("torch")) {
      Fields tf(*torch, w, "spec.mlPolicy.torch");
      TorchPolicy tp;
      tp.num_proc_per_node = num_proc_from_json(tf.get("numProcPerNode"), w + ": spec.mlPolicy.torch.numProcPerNode");
      tp.env_injection = tf.verbatim("envInjection");
      tf.refuse_unknown();
      rt.ml_policy.torch = tp;
    }
    rt.ml_policy.mpi = mf.verbatim("mpi");
    rt.ml_policy.jax = mf.verbatim("jax");
    rt.ml_policy.xgboost = mf.verbatim("xgboost");
    rt.ml_policy.flux = mf.verbatim("flux");
    mf.refuse_unknown();
    int policies = (rt.ml_policy.torch ? 1 : 0) + !rt.ml_policy.mpi.is_null() + !rt.ml_policy.jax.is_null() +
                   !rt.ml_policy.xgboost.is_null() + !rt.ml_policy.flux.is_null();
    if (policies > 1) throw Error(w + ": spec.mlPolicy", "only one of the policies can be configured");
  }
  rt.pod_group_policy = f.verbatim("podGroupPolicy");
  if (const Json* t = f.get("template")) {
    if (!t->is_object()) throw Error(w + ": spec.template", "must be a mapping");
    rt.template_ = *t;
  }
  f.refuse_unknown();
  top.refuse_unknown();
  rt.replicated_jobs();  // fail early on a malformed template
  return rt;
}

Json to_json(const TrainingRuntime& rt) {
  Json j = Json::object();
  j["apiVersion"] = kApiVersion;
  j["kind"] = rt.kind;
  j["metadata"] = meta_to_json(rt.metadata);
  Json spec = Json::object();
  Json ml = Json::object();
  if (rt.ml_policy.num_nodes) ml["numNodes"] = *rt.ml_policy.num_nodes;
  if (rt.ml_policy.torch) {
    Json t = Json::object();
    if (!rt.ml_policy.torch->num_proc_per_node.empty()) {
      static const std::regex integer("^[0-9]+$");
      if (std::regex_match(rt.ml_policy.torch->num_proc_per_node, integer))
        t["numProcPerNode"] = std::stoi(rt.ml_policy.torch->num_proc_per_node);
      else
        t["numProcPerNode"] = rt.ml_policy.torch->num_proc_per_node;
    }
    if (!rt.ml_policy.torch->env_injection.is_null()) t["envInjection"] = rt.ml_policy.torch->env_injection;
    ml["torch"] = t;
  }
  if (!rt.ml_policy.mpi.is_null()) ml["mpi"] = rt.ml_policy.mpi;
  if (!rt.ml_policy.jax.is_null()) ml["jax"] = rt.ml_policy.jax;
  if (!rt.ml_policy.xgboost.is_null()) ml["xgboost"] = rt.ml_policy.xgboost;
  if (!rt.ml_policy.flux.is_null()) ml["flux"] = rt.ml_policy.flux;
  spec["mlPolicy"] = ml;
  if (!rt.pod_group_policy.is_null()) spec["podGroupPolicy"] = rt.pod_group_policy;
  spec["template"] = rt.template_;
  j["spec"] = spec;
  return j;
}

// ---- YAML ----

std::vector<Json> parse_yaml_documents(const std::string& text, const std::string& where) {
  std::vector<Json> out;
  try {
    for (const YAML::Node& doc : YAML::LoadAll(text)) {
      if (doc.IsNull()) continue;
      out.push_back(yaml_to_json(doc, where));
    }
  } catch (const YAML::Exception& e) {
    throw Error(where + ":" + std::to_string(e.mark.line + 1), "invalid YAML: " + e.msg);
  }
  return out;
}

std::vector<Json> load_yaml_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(path, "cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  // JSON is YAML, but nlohmann gives better messages for it.
  if (path.size() > 5 && path.substr(path.size() - 5) == ".json") {
    try {
      return {Json::parse(text)};
    } catch (const Json::parse_error& e) {
      throw Error(path, std::string("invalid JSON: ") + e.what());
    }
  }
  return parse_yaml_documents(text, path);
}

std::string to_yaml(const Json& doc) {
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  emit_json(out, doc);
  std::string s = out.c_str();
  if (s.empty() || s.back() != '\n') s += '\n';
  return s;
}

std::string to_yaml(const TrainJob& job) { return to_yaml(to_json(job)); }
std::string to_yaml(const TrainingRuntime& runtime) { return to_yaml(to_json(runtime)); }

}  // namespace ktune::v1alpha1
