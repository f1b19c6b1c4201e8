// Shared by the Kubernetes backend's tests (kubernetes_backend_test, kube_tls_test,
// kube_log_stream_test): the fake API server (tests/sdk/kube_api_server.py) started over HTTPS with
// a fresh PKI, kubeconfigs for it, its /_test/ control port, pods as the controller makes them, and
// a fixture that submits a TrainJob as `ktune train` does.
// It deliberately holds no test of its own.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../hub/test_processes.h"
#include "core/log.h"
#include "hub/digest.h"
#include "runtime/runtime_catalog.h"
#include "runtime/v1alpha1.h"
#include "sdk/kubernetes_backend.h"
#include "sdk/trainer_client.h"

namespace ktune::sdk::kube_testing {

namespace fs = std::filesystem;
using hub::testing::CommandResult;
using hub::testing::run_command;
using hub::testing::ServerProcess;
using hub::testing::TempDir;
using hub::testing::write_file;
using Json = nlohmann::json;

inline const std::string kToken = "kube-token-7f3a9c2e51d04b86";
// The trainer pods' projected token for Kubeflow Trainer's status endpoint (KEP-2779).
inline const std::string kStatusToken = "status-token-52c1e8a09d7b4f36";
inline const std::string kHfToken = "hf_k8sSecretToken0123456789";
inline const std::string kServerScript = std::string(KTUNE_SOURCE_DIR) + "/tests/sdk/kube_api_server.py";
inline const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";

// A kubeconfig whose current context "fake" (namespace team-a) points at `server`; `cluster` and
// `user` are more lines of the cluster and user entries ("    key: value\n" each).
inline std::string kubeconfig_yaml(const std::string& server, const std::string& cluster, const std::string& user,
                            const std::string& ns = "team-a") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
         "clusters:\n- name: fake-cluster\n  cluster:\n    server: " + server + "\n" + cluster +
         "contexts:\n- name: other\n  context: {cluster: fake-cluster, user: nobody}\n"
         "- name: fake\n  context:\n    cluster: fake-cluster\n    user: tester\n    namespace: " + ns + "\n"
         "users:\n- name: tester\n" + (user.empty() ? "  user: {}\n" : "  user:\n" + user) +
         "- name: nobody\n  user: {}\n";
}

inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

// A tiny client for the server's /_test/ control endpoints (a plain-HTTP port of their own).
inline Json control(int port, const std::string& method, const std::string& path, const Json& body = nullptr) {
  hub::HttpClient http;
  hub::HttpRequest r;
  r.method = method;
  r.url = "http://127.0.0.1:" + std::to_string(port) + path;
  if (!body.is_null()) {
    r.body = body.dump();
    r.headers.emplace_back("Content-Type", "application/json");
  }
  hub::HttpResponse resp = http.perform(r);
  EXPECT_EQ(resp.status, 200) << path << ": " << resp.body;
  return resp.body.empty() ? Json() : Json::parse(resp.body);
}

inline Json pod(const std::string& job, const std::string& role, int index, const std::string& phase,
         const std::string& created, Json extra_container = Json::object()) {
  const std::string container = role == "node" ? "node" : role;
  Json c = {{"name", container}, {"image", "ghcr.io/ktune/ktune-trainer:0.1.0"}};
  c.update(extra_container);
  return {{"metadata",
           {{"name", job + "-" + role + "-0-" + std::to_string(index) + "-" + created.substr(17, 2)},
            {"namespace", "team-a"},
            {"creationTimestamp", created},
            {"labels",
             {{"jobset.sigs.k8s.io/jobset-name", job},
              {"jobset.sigs.k8s.io/replicatedjob-name", role},
              {"batch.kubernetes.io/job-completion-index", std::to_string(index)}}}}},
          {"spec", {{"containers", Json::array({c})}}},
          {"status", {{"phase", phase}, {"startTime", created}}}};
}

// The fake API server over HTTPS (its PKI in `pki_dir`), or plain HTTP when pki_dir is "".
inline std::unique_ptr<ServerProcess> start_server(const std::string& pki_dir, const std::string& client_cert = "optional") {
  std::vector<std::string> args{"--token", kToken, "--status-token", kStatusToken, "--max-seconds", "120"};
  if (!pki_dir.empty()) args.insert(args.end(), {"--tls-dir", pki_dir, "--client-cert", client_cert});
  return std::make_unique<ServerProcess>(kServerScript, args);
}

class KubernetesBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!hub::testing::python_has("cryptography")) GTEST_SKIP() << "python3 cryptography (the test PKI) is not installed";
    pki_ = dir_ / "pki";
    server_ = start_server(pki_);
    ASSERT_TRUE(server_->ready()) << "the fake API server did not start";
    port_ = server_->port();
    control_port_ = server_->info().value("control_port", 0);
    kubeconfig_ = dir_ / "kubeconfig";
    write_file(kubeconfig_, kubeconfig_text(kToken));
    install_ktune_runtimes();
  }
  // The fake cluster as the README sets one up: ktune's runtimes installed (kubectl apply -k manifests/).
  void install_ktune_runtimes() {
    Json runtimes = Json::object();
    const RuntimeCatalog builtin = RuntimeCatalog::builtin();  // named: runtimes() is a reference into it
    for (const v1alpha1::TrainingRuntime& r : builtin.runtimes())
      runtimes[r.metadata.name] = Json::parse(v1alpha1::to_json(r).dump());
    set_state({{"runtimes", runtimes}});
  }
  std::string server_url(const std::string& host = "127.0.0.1") const {
    return "https://" + host + ":" + std::to_string(port_);
  }
  std::string pem(const std::string& name) const { return hub::testing::read_file(pki_ + "/" + name); }
  // Bearer token over TLS, the CA given as certificate-authority-data.
  std::string kubeconfig_text(const std::string& token) const {
    return kubeconfig_yaml(server_url() + "/", "    certificate-authority-data: " + hub::base64_encode(pem("ca.crt")) + "\n",
                           "    token: " + token + "\n");
  }
  KubernetesBackend backend() { return KubernetesBackend(parse_kubeconfig(kubeconfig_text(kToken), kubeconfig_), ""); }
  std::unique_ptr<KubernetesBackend> make_backend() {
    return std::make_unique<KubernetesBackend>(parse_kubeconfig(kubeconfig_text(kToken), kubeconfig_), "");
  }
  Json requests() { return control(control_port_, "GET", "/_test/requests"); }
  void set_state(const Json& state) { control(control_port_, "PUT", "/_test/state", state); }
  CommandResult ktune(const std::vector<std::string>& args, std::map<std::string, std::string> env = {}) {
    std::vector<std::string> argv{kKtune};
    argv.insert(argv.end(), args.begin(), args.end());
    env.emplace("KUBECONFIG", kubeconfig_);
    env.emplace("KTUNE_HOME", dir_ / "home");
    return run_command(argv, env);
  }
  // A job submitted through TrainerClient on the builtin catalog, as `ktune train` does.
  std::string submit(const std::string& name, int num_nodes = 1) {
    TrainerClient client(make_backend(), RuntimeCatalog::builtin());
    types::Initializer init;
    init.dataset = types::HuggingFaceDatasetInitializer{"hf://tatsu-lab/alpaca/data", std::nullopt, std::nullopt};
    types::HuggingFaceModelInitializer model;
    model.storage_uri = "hf://meta-llama/Llama-3.2-1B-Instruct";
    model.access_token = kHfToken;
    init.model = model;
    types::TorchTuneConfig cfg;
    cfg.epochs = 1;
    if (num_nodes > 1) cfg.num_nodes = num_nodes;
    return client.train(client.get_runtime(num_nodes > 1 ? "torchtune-llama3.3-70b" : "torchtune-llama3.2-1b"), &init,
                        types::BuiltinTrainer{cfg}, {.name = name});
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::string pki_;
  int port_ = 0, control_port_ = 0;
  std::string kubeconfig_;
};

}  // namespace ktune::sdk::kube_testing
