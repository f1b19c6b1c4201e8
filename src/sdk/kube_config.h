// Where a Kubernetes API server is and how to talk to it: read from a kubeconfig file (the
// current context, or a named one: its cluster's server, CA data or file, insecure-skip-tls-verify;
// its user's token, tokenFile, client certificate and key, as data or files; its namespace) or,
// inside a pod, from the service account (KUBERNETES_SERVICE_HOST/PORT and
// /var/run/secrets/kubernetes.io/serviceaccount/{token,ca.crt,namespace}).
// Search order: an explicit path, else the first existing file of $KUBECONFIG (colon-separated;
// files are not merged as kubectl merges them), else ~/.kube/config, else the in-cluster account.
// Every credential read is registered with core/log.h (register_secret), so no log line, error or
// redact()ed text shows it.
// It deliberately does not support exec/auth-provider plugins (cloud CLIs that mint tokens); a
// user entry with one and no token is refused with that reason.
#pragma once

#include <string>

#include "hub/http_client.h"

namespace ktune::sdk {

struct KubeConnection {
  std::string server;        // "https://10.0.0.1:6443" (no trailing '/')
  std::string namespace_;    // the context's namespace ("" when it names none)
  std::string bearer_token;  // "" for client-certificate or anonymous access
  hub::TlsOptions tls;
  std::string source;        // "kubeconfig /path (context NAME)" or "in-cluster service account"
};

// `kubeconfig_path` "" = search as above; `context` "" = current-context. `env` and `home` stand
// in for the process environment in tests (nullptr = getenv).
KubeConnection load_kube_connection(const std::string& kubeconfig_path = "", const std::string& context = "",
                                    const char* (*env)(const char*) = nullptr);

// Parses kubeconfig text; `path` resolves relative certificate/token file names and names errors.
KubeConnection parse_kubeconfig(const std::string& text, const std::string& path, const std::string& context = "");

// The in-cluster service account under `account_dir` (tests point it elsewhere).
KubeConnection in_cluster_connection(const std::string& host, const std::string& port,
                                     const std::string& account_dir = "/var/run/secrets/kubernetes.io/serviceaccount");

}  // namespace ktune::sdk
