// kubeconfig and in-cluster service-account reading (see kube_config.h).
#include "sdk/kube_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "runtime/v1alpha1.h"

namespace ktune::sdk {

namespace fs = std::filesystem;
using Json = v1alpha1::Json;

namespace {

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path, "cannot read the " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
  size_t b = 0;
  while (b < s.size() && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n')) ++b;
  return s.substr(b);
}

// Standard base64 (RFC 4648), whitespace ignored; throws on any other character.
std::string base64_decode(const std::string& text, const std::string& where) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::string out;
  unsigned buffer = 0;
  int bits = 0;
  for (char c : text) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ' || c == '\t') continue;
    const int v = value(c);
    if (v < 0) throw Error(where, "is not base64");
    buffer = (buffer << 6) | unsigned(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((buffer >> bits) & 0xff);
    }
  }
  return out;
}

const Json* named_entry(const Json& doc, const char* list, const std::string& name) {
  if (!doc.contains(list) || !doc[list].is_array()) return nullptr;
  for (const Json& e : doc[list])
    if (e.is_object() && e.value("name", "") == name) return &e;
  return nullptr;
}

std::string str(const Json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key) || obj[key].is_null()) return "";
  if (obj[key].is_string()) return obj[key].get<std::string>();
  return obj[key].dump();
}

std::string resolve(const std::string& file, const std::string& kubeconfig_path) {
  if (file.empty() || file[0] == '/') return file;
  return (fs::path(kubeconfig_path).parent_path() / file).string();
}

}  // namespace

KubeConnection parse_kubeconfig(const std::string& text, const std::string& path, const std::string& context) {
  const std::vector<Json> docs = v1alpha1::parse_yaml_documents(text, path);
  if (docs.empty() || !docs[0].is_object()) throw Error(path, "is not a kubeconfig (no YAML mapping)");
  const Json& doc = docs[0];
  const std::string context_name = context.empty() ? str(doc, "current-context") : context;
  if (context_name.empty()) throw Error(path, "has no current-context (choose one with --context or kubectl config use-context)");
  const Json* ctx_entry = named_entry(doc, "contexts", context_name);
  if (ctx_entry == nullptr) throw Error(path + ": contexts", "no context named \"" + context_name + "\"");
  const Json ctx = ctx_entry->value("context", Json::object());
  const std::string cluster_name = str(ctx, "cluster"), user_name = str(ctx, "user");
  const Json* cluster_entry = named_entry(doc, "clusters", cluster_name);
  if (cluster_entry == nullptr)
    throw Error(path + ": contexts[" + context_name + "].cluster", "no cluster named \"" + cluster_name + "\"");
  const Json cluster = cluster_entry->value("cluster", Json::object());

  KubeConnection c;
  c.source = "kubeconfig " + path + " (context " + context_name + ")";
  c.server = str(cluster, "server");
  if (c.server.empty()) throw Error(path + ": clusters[" + cluster_name + "].cluster.server", "is not set");
  while (!c.server.empty() && c.server.back() == '/') c.server.pop_back();
  c.namespace_ = str(ctx, "namespace");
  if (const std::string ca = str(cluster, "certificate-authority-data"); !ca.empty())
    c.tls.ca_pem = base64_decode(ca, path + ": clusters[" + cluster_name + "].cluster.certificate-authority-data");
  else
    c.tls.ca_file = resolve(str(cluster, "certificate-authority"), path);
  c.tls.insecure_skip_verify = cluster.value("insecure-skip-tls-verify", false);

  if (!user_name.empty()) {
    const Json* user_entry = named_entry(doc, "users", user_name);
    if (user_entry == nullptr)
      throw Error(path + ": contexts[" + context_name + "].user", "no user named \"" + user_name + "\"");
    const Json user = user_entry->value("user", Json::object());
    const std::string where = path + ": users[" + user_name + "].user";
    c.bearer_token = str(user, "token");
    if (c.bearer_token.empty() && !str(user, "tokenFile").empty())
      c.bearer_token = trim(read_file(resolve(str(user, "tokenFile"), path), "token file of " + where));
    if (const std::string d = str(user, "client-certificate-data"); !d.empty())
      c.tls.client_cert_pem = base64_decode(d, where + ".client-certificate-data");
    else
      c.tls.client_cert_file = resolve(str(user, "client-certificate"), path);
    if (const std::string d = str(user, "client-key-data"); !d.empty())
      c.tls.client_key_pem = base64_decode(d, where + ".client-key-data");
    else
      c.tls.client_key_file = resolve(str(user, "client-key"), path);
    const bool has_plugin = user.contains("exec") || user.contains("auth-provider");
    if (has_plugin && c.bearer_token.empty() && c.tls.client_cert_pem.empty() && c.tls.client_cert_file.empty())
      throw Error(where, "uses an exec or auth-provider plugin, which ktune does not run; give the user a token "
                         "(kubectl create token ...) or a client certificate");
    if (!str(user, "username").empty() && c.bearer_token.empty())
      throw Error(where, "uses basic authentication (username/password), which ktune does not support");
  }
  register_secret(c.bearer_token);
  register_secret(c.tls.client_key_pem);
  return c;
}

KubeConnection in_cluster_connection(const std::string& host, const std::string& port, const std::string& account_dir) {
  KubeConnection c;
  c.source = "in-cluster service account";
  const bool v6 = host.find(':') != std::string::npos;
  c.server = "https://" + (v6 ? "[" + host + "]" : host) + ":" + (port.empty() ? "443" : port);
  c.bearer_token = trim(read_file(account_dir + "/token", "service account token"));
  register_secret(c.bearer_token);
  c.tls.ca_file = account_dir + "/ca.crt";
  if (fs::exists(account_dir + "/namespace")) c.namespace_ = trim(read_file(account_dir + "/namespace", "namespace"));
  return c;
}

KubeConnection load_kube_connection(const std::string& kubeconfig_path, const std::string& context,
                                    const char* (*env)(const char*)) {
  auto get = [&](const char* name) -> std::string {
    const char* v = env ? env(name) : std::getenv(name);
    return v ? v : "";
  };
  std::string path = kubeconfig_path;
  if (path.empty()) {
    const std::string list = get("KUBECONFIG");
    size_t start = 0;
    while (start <= list.size() && path.empty()) {
      const size_t colon = list.find(':', start);
      const std::string p = list.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!p.empty() && fs::exists(p)) path = p;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    if (path.empty() && !list.empty())
      throw Error("KUBECONFIG", "names no existing file: " + list);
  }
  if (path.empty() && !get("HOME").empty() && fs::exists(get("HOME") + "/.kube/config")) path = get("HOME") + "/.kube/config";
  if (!path.empty()) return parse_kubeconfig(read_file(path, "kubeconfig"), path, context);
  if (!get("KUBERNETES_SERVICE_HOST").empty())
    return in_cluster_connection(get("KUBERNETES_SERVICE_HOST"), get("KUBERNETES_SERVICE_PORT"));
  throw Error("kubernetes backend",
              "no kubeconfig (KUBECONFIG, ~/.kube/config) and not inside a cluster (KUBERNETES_SERVICE_HOST unset)");
}

}  // namespace ktune::sdk
