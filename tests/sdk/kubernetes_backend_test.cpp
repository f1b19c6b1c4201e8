// The Kubernetes backend against a fake API server (tests/sdk/kube_api_server.py on loopback, HTTPS
// with a CA, server and client certificates it makes afresh for each test, every request recorded):
// the kubeconfig and in-cluster readers; TLS as a kubeconfig asks for it (the CA from
// certificate-authority-data or a certificate-authority file, a bearer token or a client
// certificate as data or files, a wrong CA refused naming the server and the kubeconfig,
// insecure-skip-tls-verify); the exact TrainJob (and Secret) the backend POSTs, compared with
// `ktune train --dry-run` and validated against the Kubeflow Trainer CRD schema; upstream's status
// mapping from conditions and pods; logs streamed while the server is still writing them, and a
// followed stream that is cut or ended early reopened without a repeated or lost line; the API
// server's errors (401/403/404/409) with their messages; and the token in no output, error or
// request other than its Authorization header. One test keeps plain HTTP (what `kubectl proxy`
// serves). It does not run a cluster: the controller's behaviour (pods, conditions) is what the
// test sets.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "../hub/test_processes.h"
#include "core/log.h"
#include "hub/digest.h"
#include "runtime/runtime_catalog.h"
#include "runtime/v1alpha1.h"
#include "sdk/kubernetes_backend.h"
#include "sdk/trainer_client.h"

namespace ktune::sdk {
namespace {

namespace fs = std::filesystem;
using hub::testing::CommandResult;
using hub::testing::run_command;
using hub::testing::ServerProcess;
using hub::testing::TempDir;
using hub::testing::write_file;
using Json = nlohmann::json;

const std::string kToken = "kube-token-7f3a9c2e51d04b86";
const std::string kHfToken = "hf_k8sSecretToken0123456789";
const std::string kServerScript = std::string(KTUNE_SOURCE_DIR) + "/tests/sdk/kube_api_server.py";
const std::string kKtune = std::string(KTUNE_BINARY_DIR) + "/bin/ktune";

// A kubeconfig whose current context "fake" (namespace team-a) points at `server`; `cluster` and
// `user` are more lines of the cluster and user entries ("    key: value\n" each).
std::string kubeconfig_yaml(const std::string& server, const std::string& cluster, const std::string& user,
                            const std::string& ns = "team-a") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: fake\n"
         "clusters:\n- name: fake-cluster\n  cluster:\n    server: " + server + "\n" + cluster +
         "contexts:\n- name: other\n  context: {cluster: fake-cluster, user: nobody}\n"
         "- name: fake\n  context:\n    cluster: fake-cluster\n    user: tester\n    namespace: " + ns + "\n"
         "users:\n- name: tester\n" + (user.empty() ? "  user: {}\n" : "  user:\n" + user) +
         "- name: nobody\n  user: {}\n";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

// A tiny client for the server's /_test/ control endpoints (a plain-HTTP port of their own).
Json control(int port, const std::string& method, const std::string& path, const Json& body = nullptr) {
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

Json pod(const std::string& job, const std::string& role, int index, const std::string& phase,
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
std::unique_ptr<ServerProcess> start_server(const std::string& pki_dir, const std::string& client_cert = "optional") {
  std::vector<std::string> args{"--token", kToken, "--max-seconds", "120"};
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
                        types::BuiltinTrainer{cfg}, name);
  }

  TempDir dir_;
  std::unique_ptr<ServerProcess> server_;
  std::string pki_;
  int port_ = 0, control_port_ = 0;
  std::string kubeconfig_;
};

TEST(KubeConfig, ReadsTheCurrentContextWithItsClusterUserAndNamespace) {
  TempDir dir;
  write_file(dir / "certs/ca.crt", "CA");
  write_file(dir / "token", "file-token-123456\n");
  const std::string text =
      "current-context: prod\n"
      "clusters:\n- name: c1\n  cluster:\n    server: https://10.0.0.1:6443/\n"
      "    certificate-authority-data: " + hub::base64_encode("-----BEGIN CERTIFICATE-----\nX\n") + "\n"
      "- name: c2\n  cluster:\n    server: https://c2\n    certificate-authority: certs/ca.crt\n    insecure-skip-tls-verify: true\n"
      "contexts:\n- name: prod\n  context: {cluster: c1, user: u1, namespace: ml}\n"
      "- name: dev\n  context: {cluster: c2, user: u2}\n"
      "users:\n- name: u1\n  user:\n    client-certificate-data: " + hub::base64_encode("CERT") + "\n"
      "    client-key-data: " + hub::base64_encode("KEY-SECRET-VALUE") + "\n"
      "- name: u2\n  user:\n    tokenFile: token\n";
  const KubeConnection prod = parse_kubeconfig(text, dir / "config");
  EXPECT_EQ(prod.server, "https://10.0.0.1:6443");
  EXPECT_EQ(prod.namespace_, "ml");
  EXPECT_EQ(prod.tls.ca_pem, "-----BEGIN CERTIFICATE-----\nX\n");
  EXPECT_EQ(prod.tls.client_cert_pem, "CERT");
  EXPECT_EQ(prod.tls.client_key_pem, "KEY-SECRET-VALUE");
  EXPECT_EQ(prod.bearer_token, "");
  EXPECT_EQ(redact("key KEY-SECRET-VALUE"), "key ***");
  const KubeConnection dev = parse_kubeconfig(text, dir / "config", "dev");
  EXPECT_EQ(dev.server, "https://c2");
  EXPECT_EQ(dev.tls.ca_file, dir / "certs/ca.crt");
  EXPECT_TRUE(dev.tls.insecure_skip_verify);
  EXPECT_EQ(dev.bearer_token, "file-token-123456");
  EXPECT_EQ(dev.namespace_, "");
  EXPECT_EQ(redact("Bearer file-token-123456"), "Bearer ***");
  // The backend's namespace: the flag, else the context's, else "default".
  EXPECT_EQ(KubernetesBackend(prod, "").kubernetes_namespace(), "ml");
  EXPECT_EQ(KubernetesBackend(dev, "").kubernetes_namespace(), "default");
  EXPECT_EQ(KubernetesBackend(prod, "other").kubernetes_namespace(), "other");
}

TEST(KubeConfig, RefusesWhatItCannotUseWithThePlace) {
  auto error_of = [](const std::string& text, const std::string& context = "") {
    try {
      parse_kubeconfig(text, "/k/config", context);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string base = "clusters:\n- name: c\n  cluster: {server: https://x}\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n";
  EXPECT_NE(error_of(base + "users: []\n").find("no current-context"), std::string::npos);
  EXPECT_NE(error_of(base + "current-context: b\n").find("no context named \"b\""), std::string::npos);
  EXPECT_NE(error_of(base + "current-context: a\nusers: []\n").find("no user named \"u\""), std::string::npos);
  const std::string exec = base + "current-context: a\nusers:\n- name: u\n  user:\n    exec: {command: aws}\n";
  EXPECT_NE(error_of(exec).find("exec or auth-provider plugin"), std::string::npos) << error_of(exec);
  EXPECT_NE(error_of("current-context: a\ncontexts:\n- name: a\n  context: {cluster: c}\nclusters:\n- name: c\n  cluster: {}\n")
                .find("server: is not set"),
            std::string::npos);
}

TEST(KubeConfig, SearchesKubeconfigThenHomeThenTheServiceAccount) {
  TempDir dir;
  write_file(dir / "b/config", "current-context: a\nclusters:\n- name: c\n  cluster: {server: https://b}\n"
                               "contexts:\n- name: a\n  context: {cluster: c}\n");
  static std::map<std::string, std::string> env;
  auto lookup = +[](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  env = {{"KUBECONFIG", dir / "missing:" + dir / "b/config"}};
  EXPECT_EQ(load_kube_connection("", "", lookup).server, "https://b");
  env = {{"KUBECONFIG", dir / "missing"}};
  EXPECT_THROW(load_kube_connection("", "", lookup), Error);
  env = {{"HOME", dir.path}, {"KUBERNETES_SERVICE_HOST", "10.96.0.1"}, {"KUBERNETES_SERVICE_PORT", "443"}};
  EXPECT_THROW(load_kube_connection("", "", lookup), Error);  // no token file at the real account path here
  write_file(dir / "sa/token", "sa-token-abcdef\n");
  write_file(dir / "sa/namespace", "jobs\n");
  const KubeConnection sa = in_cluster_connection("10.96.0.1", "443", dir / "sa");
  EXPECT_EQ(sa.server, "https://10.96.0.1:443");
  EXPECT_EQ(sa.bearer_token, "sa-token-abcdef");
  EXPECT_EQ(sa.namespace_, "jobs");
  EXPECT_EQ(sa.tls.ca_file, dir / "sa/ca.crt");
  env = {{"HOME", dir.path}};
  EXPECT_THROW(load_kube_connection("", "", lookup), Error);
}

TEST(Rfc3339, ParsesUtcFractionsAndOffsets) {
  EXPECT_EQ(parse_rfc3339("2026-12-02T13:10:00Z"), 1796217000.0);
  EXPECT_EQ(parse_rfc3339("2026-12-02T13:10:00.5Z"), 1796217000.5);
  EXPECT_EQ(parse_rfc3339("2026-12-02T15:10:00+02:00"), 1796217000.0);
  EXPECT_EQ(parse_rfc3339("yesterday"), 0.0);
  // To the nanosecond, as log lines carry it (Go's RFC3339Nano drops trailing zeros).
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00Z"), 1796217000LL * 1000000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.5Z"), 1796217000LL * 1000000000 + 500000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.000000001Z"), 1796217000LL * 1000000000 + 1);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T14:10:00.25+01:00"), 1796217000LL * 1000000000 + 250000000);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00.Z"), -1);
  EXPECT_EQ(parse_rfc3339_ns("2026-12-02T13:10:00Zjunk"), -1);
  EXPECT_EQ(format_rfc3339_seconds(1796217000LL * 1000000000 + 999999999), "2026-12-02T13:10:00Z");
}

// The TrainJob posted is the one `ktune train --dry-run --backend kubernetes` prints, valid for the
// CRD; the access token travels in a Secret the job owns, and appears nowhere else.
TEST_F(KubernetesBackendTest, SubmitPostsTheDryRunTrainJobAndKeepsTheTokenInASecret) {
  if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  const std::vector<std::string> args = {"train", "--backend", "kubernetes", "--runtime", "torchtune-llama3.2-1b",
                                         "--model", "hf://meta-llama/Llama-3.2-1B-Instruct", "--dataset",
                                         "hf://tatsu-lab/alpaca/data", "--lora-rank", "8", "--epochs", "1",
                                         "--name", "k8s-job"};
  std::vector<std::string> dry = args;
  dry.push_back("--dry-run");
  const CommandResult printed = ktune(dry, {{"HF_TOKEN", kHfToken}});
  ASSERT_EQ(printed.exit_code, 0) << printed.err;
  EXPECT_NE(printed.err.find("Secret team-a/k8s-job-ktune-secrets with keys: dataset.ACCESS_TOKEN, model.ACCESS_TOKEN"), std::string::npos)
      << printed.err;
  const Json dry_log = requests();  // named: a range-for over a temporary's element would dangle
  for (const Json& r : dry_log["requests"]) EXPECT_EQ(r["method"], "GET") << "a dry run only reads: " << r.dump();
  const CommandResult submitted = ktune(args, {{"HF_TOKEN", kHfToken}});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
  EXPECT_EQ(submitted.out, "k8s-job\n");
  EXPECT_NE(submitted.err.find("on the kubernetes backend"), std::string::npos) << submitted.err;

  const Json log = requests();
  Json reqs = Json::array();  // the writes (the reads are the cluster's runtime lists)
  for (const Json& r : log["requests"])
    if (r["method"] != "GET") reqs.push_back(r);
  ASSERT_EQ(reqs.size(), 3u) << log["requests"].dump(1);
  EXPECT_EQ(reqs[0]["method"], "POST");
  EXPECT_EQ(reqs[0]["path"], "/api/v1/namespaces/team-a/secrets");
  EXPECT_EQ(reqs[1]["method"], "POST");
  EXPECT_EQ(reqs[1]["path"], "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs");
  EXPECT_EQ(reqs[1]["headers"]["content-type"], "application/json");
  EXPECT_EQ(reqs[2]["method"], "PATCH");
  EXPECT_EQ(reqs[2]["path"], "/api/v1/namespaces/team-a/secrets/k8s-job-ktune-secrets");
  for (const Json& r : log["requests"]) {
    EXPECT_EQ(r["headers"]["authorization"], "Bearer " + kToken);
    EXPECT_EQ(r["tls"], true);
  }

  // The posted TrainJob is the printed one.
  const std::vector<v1alpha1::Json> docs = v1alpha1::parse_yaml_documents(printed.out, "dry run");
  ASSERT_EQ(docs.size(), 1u);
  EXPECT_EQ(Json::parse(docs[0].dump()), reqs[1]["body"]);
  const Json& job = reqs[1]["body"];
  EXPECT_EQ(job["apiVersion"], "trainer.kubeflow.org/v1alpha1");
  EXPECT_EQ(job["kind"], "TrainJob");
  EXPECT_EQ(job["metadata"]["name"], "k8s-job");
  EXPECT_EQ(job["metadata"]["namespace"], "team-a");
  EXPECT_EQ(job["spec"]["runtimeRef"]["name"], "torchtune-llama3.2-1b");
  EXPECT_EQ(job["spec"]["trainer"]["command"], Json::array({"tune", "run"}));
  const Json& model_env = job["spec"]["initializer"]["model"]["env"];
  bool token_ref = false;
  for (const Json& e : model_env)
    if (e["name"] == "ACCESS_TOKEN") {
      EXPECT_FALSE(e.contains("value"));
      EXPECT_EQ(e["valueFrom"]["secretKeyRef"], (Json{{"name", "k8s-job-ktune-secrets"}, {"key", "model.ACCESS_TOKEN"}}));
      token_ref = true;
    }
  EXPECT_TRUE(token_ref) << model_env.dump();
  // The Secret holds the token and belongs to the TrainJob.
  const Json& secret = log["secrets"]["k8s-job-ktune-secrets"];
  EXPECT_EQ(secret["stringData"]["model.ACCESS_TOKEN"], kHfToken);
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["kind"], "TrainJob");
  EXPECT_EQ(secret["metadata"]["ownerReferences"][0]["name"], "k8s-job");
  EXPECT_FALSE(secret["metadata"]["ownerReferences"][0]["uid"].get<std::string>().empty());
  // No token in what ktune printed, nor the HF token in any request but the Secret's.
  for (const std::string& text : {printed.out, printed.err, submitted.out, submitted.err}) {
    EXPECT_EQ(text.find(kToken), std::string::npos) << text;
    EXPECT_EQ(text.find(kHfToken), std::string::npos) << text;
  }
  for (size_t i = 1; i < reqs.size(); ++i) EXPECT_EQ(reqs[i].dump().find(kHfToken), std::string::npos) << reqs[i].dump();

  // Valid for the Kubeflow Trainer CRD (and its generated models, where installed).
  write_file(dir_ / "posted.json", job.dump(1));
  const int rc = std::system(("python3 " + std::string(KTUNE_SOURCE_DIR) + "/tests/runtime/check_trainer_schema.py '" +
                              dir_ / "posted.json' >'" + dir_ / "schema.out' 2>&1").c_str());
  const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  if (code == 77) GTEST_SKIP() << "jsonschema is not installed";
  EXPECT_EQ(code, 0) << hub::testing::read_file(dir_ / "schema.out");
}

// TrainerClient on the Kubernetes backend takes the cluster's runtimes over the builtin ones (a list
// it may not read is skipped), and a job's node count comes from its runtime when the job sets none.
TEST_F(KubernetesBackendTest, TheClustersRuntimesReplaceTheBuiltinOnes) {
  std::string yaml;
  for (const EmbeddedManifest& m : embedded_manifests())
    if (std::string(m.text).find("name: torchtune-llama3.2-1b\n") != std::string::npos) yaml = m.text;
  ASSERT_FALSE(yaml.empty());
  Json runtime = Json::parse(v1alpha1::parse_yaml_documents(yaml, "manifest")[0].dump());
  runtime["metadata"]["uid"] = "r-1";
  runtime["spec"]["mlPolicy"]["numNodes"] = 1;
  Json custom = runtime;
  custom["metadata"]["name"] = "torchtune-llama3.3-70b";
  custom["spec"]["mlPolicy"]["numNodes"] = 2;
  for (Json& rj : custom["spec"]["template"]["spec"]["replicatedJobs"])
    for (Json& c : rj["template"]["spec"]["template"]["spec"]["containers"])
      if (c["name"] == "node") c["image"] = "registry.example/ktune-trainer:dev";
  set_state({{"runtimes", {{"torchtune-llama3.2-1b", runtime}, {"torchtune-llama3.3-70b", custom}}}});
  BackendConfig config;
  config.kind = BackendConfig::Kind::Kubernetes;
  config.kubeconfig = kubeconfig_;
  TrainerClient client(config);
  EXPECT_EQ(client.get_runtime("torchtune-llama3.3-70b").trainer.image, "registry.example/ktune-trainer:dev");
  EXPECT_EQ(client.get_runtime("torchtune-qwen2.5-7b").name, "torchtune-qwen2.5-7b");  // builtin, not on the cluster
  types::TorchTuneConfig cfg;
  cfg.epochs = 1;
  const std::string name = client.train(client.get_runtime("torchtune-llama3.3-70b"), nullptr, types::BuiltinTrainer{cfg});
  const TrainJobRecord r = client.get_job_record(name);
  EXPECT_EQ(r.num_nodes, 2);
  EXPECT_EQ(r.trainer_type, "BuiltinTrainer");
}

TEST_F(KubernetesBackendTest, StatusFollowsUpstreamsMappingOfConditionsAndPods) {
  ASSERT_EQ(submit("job-a"), "job-a");
  KubernetesBackend k = backend();
  // No pods yet: Created, no steps.
  TrainJobRecord r = k.get_job("job-a");
  EXPECT_EQ(r.status, "Created");
  EXPECT_EQ(r.runtime, "torchtune-llama3.2-1b");
  EXPECT_GT(r.created_at, 0);
  EXPECT_TRUE(r.steps.empty());
  // Initializers done, node pending: still Created. An older failed pod of a step is ignored.
  Json gpu = {{"resources", {{"limits", {{"nvidia.com/gpu", "2"}, {"cpu", "8"}}}}},
              {"env", Json::array({{{"name", "PET_NPROC_PER_NODE"}, {"value", "2"}}})}};
  set_state({{"pods",
              {{"job-a",
                Json::array({pod("job-a", "model-initializer", 0, "Failed", "2026-12-02T10:00:01Z"),
                             pod("job-a", "model-initializer", 0, "Succeeded", "2026-12-02T10:00:05Z"),
                             pod("job-a", "dataset-initializer", 0, "Succeeded", "2026-12-02T10:00:02Z"),
                             pod("job-a", "node", 0, "Pending", "2026-12-02T10:01:00Z", gpu),
                             pod("other", "node", 0, "Running", "2026-12-02T10:01:00Z")})}}}});
  r = k.get_job("job-a");
  EXPECT_EQ(r.status, "Created");
  ASSERT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[0].name, "dataset-initializer");
  EXPECT_EQ(r.steps[1].name, "model-initializer");
  EXPECT_EQ(r.steps[1].status, "Complete");
  EXPECT_EQ(r.steps[1].pod_name, "job-a-model-initializer-0-0-05");
  EXPECT_EQ(r.steps[2].name, "node-0");
  EXPECT_EQ(r.steps[2].status, "Created");
  EXPECT_EQ(r.steps[2].device, "gpu");
  EXPECT_EQ(r.steps[2].device_count, "2");  // PET_NPROC_PER_NODE wins, as upstream
  // Every node running: Running.
  set_state({{"pods", {{"job-a", Json::array({pod("job-a", "node", 0, "Running", "2026-12-02T10:02:00Z")})}}}});
  EXPECT_EQ(k.get_job("job-a").status, "Running");
  // A terminal condition decides, with its message as the reason; trainerStatus is the progress.
  set_state({{"status",
              {{"job-a",
                {{"conditions", Json::array({{{"type", "Suspended"}, {"status", "False"}},
                                             {{"type", "Failed"}, {"status", "True"}, {"reason", "TrainerFailed"},
                                              {"message", "node-0 exited 1"},
                                              {"lastTransitionTime", "2026-12-02T10:05:00Z"}}})},
                 {"trainerStatus",
                  {{"progressPercentage", 40},
                   {"estimatedRemainingSeconds", 90},
                   {"metrics", Json::array({{{"name", "loss"}, {"value", "1.25"}}})}}}}}}}});
  r = k.get_job("job-a");
  EXPECT_EQ(r.status, "Failed");
  EXPECT_EQ(r.reason, "TrainerFailed: node-0 exited 1");
  EXPECT_TRUE(r.progress.present);
  EXPECT_EQ(r.progress.progress_percentage, 40);
  EXPECT_EQ(r.progress.estimated_remaining_seconds, 90);
  EXPECT_EQ(r.progress.metrics.at("loss"), 1.25);
  set_state({{"status", {{"job-a", {{"conditions", Json::array({{{"type", "Complete"}, {"status", "True"}}})}}}}}});
  EXPECT_EQ(k.get_job("job-a").status, "Complete");

  // Two nodes, one running: Created (upstream counts nodes against numNodes).
  ASSERT_EQ(submit("job-b", 2), "job-b");
  set_state({{"pods",
              {{"job-b", Json::array({pod("job-b", "node", 0, "Running", "2026-12-02T10:02:00Z"),
                                      pod("job-b", "node", 1, "Pending", "2026-12-02T10:02:00Z")})}}}});
  EXPECT_EQ(k.get_job("job-b").num_nodes, 2);
  EXPECT_EQ(k.get_job("job-b").status, "Created");
  set_state({{"pods",
              {{"job-b", Json::array({pod("job-b", "node", 0, "Running", "2026-12-02T10:02:00Z"),
                                      pod("job-b", "node", 1, "Running", "2026-12-02T10:02:01Z")})}}}});
  EXPECT_EQ(k.get_job("job-b").status, "Running");

  // list_jobs filters by runtime; TrainerClient's wait sees Complete.
  EXPECT_EQ(k.list_jobs().size(), 2u);
  EXPECT_EQ(k.list_jobs("torchtune-llama3.3-70b").size(), 1u);
  TrainerClient client(make_backend(), RuntimeCatalog::builtin());
  EXPECT_EQ(client.wait_for_job_status("job-a", {"Complete"}, 10, 0.1).status, "Complete");
  EXPECT_THROW(client.wait_for_job_status("job-b", {"Complete"}, 0.5, 0.1), WaitTimeoutError);
  // Deleting removes the job and its Secret.
  client.delete_job("job-a");
  EXPECT_THROW(k.get_job("job-a"), Error);
  EXPECT_FALSE(requests()["secrets"].contains("job-a-ktune-secrets"));
}

TEST_F(KubernetesBackendTest, FollowedLogsArriveWhileTheServerIsStillWriting) {
  ASSERT_EQ(submit("job-l"), "job-l");
  const Json node = pod("job-l", "node", 0, "Running", "2026-12-02T10:02:00Z");
  const std::string pod_name = node["metadata"]["name"];
  set_state({{"pods", {{"job-l", Json::array({node})}}},
             {"logs", {{pod_name + "/node", {{"lines", {"step 1", "step 2", "step 3", "done"}}, {"hold_after", 2}}}}}});
  KubernetesBackend k = backend();
  std::vector<std::string> lines;
  k.get_job_logs("job-l", "node-0", /*follow=*/true, [&](const std::string& l) {
    lines.push_back(l);
    if (lines.size() == 2) control(control_port_, "POST", "/_test/release");  // the server holds the rest until now
    return true;
  });
  EXPECT_EQ(lines, (std::vector<std::string>{"step 1", "step 2", "step 3", "done"}));
  const Json log = requests();
  EXPECT_EQ(log["held_released"], Json::array({true})) << "the first lines did not arrive before the last were sent";
  std::vector<std::string> log_paths;
  for (const Json& r : log["requests"])
    if (r["path"].get<std::string>().find("/log?") != std::string::npos) log_paths.push_back(r["path"]);
  // One stream, with timestamps (for a reopened stream to resume from); the container then ended.
  EXPECT_EQ(log_paths, (std::vector<std::string>{"/api/v1/namespaces/team-a/pods/" + pod_name +
                                                 "/log?container=node&timestamps=true&follow=true"}));
  EXPECT_EQ(log["requests"].back()["path"], "/api/v1/namespaces/team-a/pods/" + pod_name);
  // Without follow: the whole log; a sink may stop early.
  std::vector<std::string> all;
  k.get_job_logs("job-l", "node-0", false, [&](const std::string& l) {
    all.push_back(l);
    return all.size() < 3;
  });
  EXPECT_EQ(all, (std::vector<std::string>{"step 1", "step 2", "step 3"}));
  // A step whose pod is still pending, of a job that ended: no lines, as upstream.
  set_state({{"pods", {{"job-l", Json::array({pod("job-l", "node", 0, "Pending", "2026-12-02T10:03:00Z")})}}},
             {"status", {{"job-l", {{"conditions", Json::array({{{"type", "Failed"}, {"status", "True"}}})}}}}}});
  int count = 0;
  k.set_poll_interval(0.05);
  k.get_job_logs("job-l", "node-0", true, [&](const std::string&) { return ++count, true; });
  EXPECT_EQ(count, 0);
}

TEST_F(KubernetesBackendTest, ApiServerErrorsSurfaceWithTheirMessage) {
  KubernetesBackend k = backend();
  // 404
  const std::string missing = error_of([&] { k.get_job("nope"); });
  EXPECT_NE(missing.find("TrainJob team-a/nope"), std::string::npos) << missing;
  EXPECT_NE(missing.find("404 NotFound: trainjobs.trainer.kubeflow.org \"nope\" not found"), std::string::npos) << missing;
  EXPECT_NE(error_of([&] { k.delete_job("nope"); }).find("404 NotFound"), std::string::npos);
  // 409: the same name twice; the second Secret is refused first.
  ASSERT_EQ(submit("dup"), "dup");
  const std::string dup = error_of([&] { submit("dup"); });
  EXPECT_NE(dup.find("409 AlreadyExists: secrets \"dup-ktune-secrets\" already exists"), std::string::npos) << dup;
  // 403 on the TrainJob: the message says why, and the Secret made for it is deleted again.
  set_state({{"errors", Json::array({{{"method", "POST"},
                                      {"path", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs"},
                                      {"status", 403},
                                      {"reason", "Forbidden"},
                                      {"message", "trainjobs.trainer.kubeflow.org is forbidden: User \"system:serviceaccount:team-a:ci\" "
                                                  "cannot create resource \"trainjobs\" in the namespace \"team-a\""}}})}});
  const std::string forbidden = error_of([&] { submit("denied"); });
  EXPECT_NE(forbidden.find("403 Forbidden: trainjobs.trainer.kubeflow.org is forbidden: User"), std::string::npos) << forbidden;
  const Json log = requests();
  EXPECT_FALSE(log["secrets"].contains("denied-ktune-secrets"));
  EXPECT_EQ(log["requests"].back()["method"], "DELETE");
  // 401: a wrong token; the message names no token.
  KubernetesBackend wrong(parse_kubeconfig(kubeconfig_text("wrong-token-value-99"), kubeconfig_), "");
  const std::string unauthorized = error_of([&] { wrong.list_jobs(); });
  EXPECT_NE(unauthorized.find("401 Unauthorized"), std::string::npos) << unauthorized;
  for (const std::string& text : {missing, dup, forbidden, unauthorized}) {
    EXPECT_EQ(text.find(kToken), std::string::npos);
    EXPECT_EQ(text.find("wrong-token-value-99"), std::string::npos);
  }
  // An unreachable server says which one.
  KubeConnection gone = parse_kubeconfig(kubeconfig_yaml("https://127.0.0.1:1", "", "    token: " + kToken + "\n"), kubeconfig_);
  const std::string unreachable = error_of([&] { KubernetesBackend(gone, "").list_jobs(); });
  EXPECT_NE(unreachable.find("cannot reach the API server https://127.0.0.1:1 (kubeconfig " + kubeconfig_ + " (context fake))"),
            std::string::npos) << unreachable;
}

// `ktune jobs ... --backend kubernetes` (and KTUNE_BACKEND=kubernetes) from the shell.
TEST_F(KubernetesBackendTest, JobsCommandsWorkOnTheKubernetesBackend) {
  if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  ASSERT_EQ(submit("cli-job"), "cli-job");
  const Json node = pod("cli-job", "node", 0, "Running", "2026-12-02T10:02:00Z");
  set_state({{"pods", {{"cli-job", Json::array({node})}}},
             {"logs", {{node["metadata"]["name"].get<std::string>() + "/node", {{"lines", {"hello from node-0"}}}}}}});
  const CommandResult list = ktune({"jobs", "list", "--backend", "kubernetes"});
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_TRUE(std::regex_search(list.out, std::regex("cli-job +Running +torchtune-llama3.2-1b +0/1 "))) << list.out;
  const CommandResult get = ktune({"jobs", "get", "cli-job"}, {{"KTUNE_BACKEND", "kubernetes"}});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  EXPECT_NE(get.out.find("Status:      Running"), std::string::npos) << get.out;
  EXPECT_NE(get.out.find("pod/" + node["metadata"]["name"].get<std::string>()), std::string::npos) << get.out;
  const CommandResult logs = ktune({"jobs", "logs", "cli-job", "-f", "--backend=kubernetes", "--namespace", "team-a"});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_EQ(logs.out, "hello from node-0\n");
  const CommandResult other_ns = ktune({"jobs", "get", "cli-job", "--backend", "kubernetes", "-n", "team-b"});
  EXPECT_EQ(other_ns.exit_code, 1);
  EXPECT_NE(other_ns.err.find("TrainJob team-b/cli-job"), std::string::npos) << other_ns.err;
  const CommandResult del = ktune({"jobs", "delete", "cli-job", "--backend", "kubernetes"});
  EXPECT_EQ(del.exit_code, 0) << del.err;
  for (const CommandResult* r : {&list, &get, &logs, &other_ns, &del}) {
    EXPECT_EQ(r->out.find(kToken), std::string::npos);
    EXPECT_EQ(r->err.find(kToken), std::string::npos);
  }
}

// --- TLS, as the kubeconfig asks for it ------------------------------------------------------

// A bearer token over TLS, the server verified against the cluster CA given inline
// (certificate-authority-data) or as a file next to the kubeconfig; localhost and 127.0.0.1 are
// both names in the server's certificate.
TEST_F(KubernetesBackendTest, TokenOverTlsWithTheCaFromDataOrFile) {
  EXPECT_TRUE(backend().list_jobs().empty());
  write_file(dir_ / "certs/cluster-ca.crt", pem("ca.crt"));
  const std::string from_file = kubeconfig_yaml(server_url("localhost"), "    certificate-authority: certs/cluster-ca.crt\n",
                                                "    token: " + kToken + "\n");
  const KubeConnection c = parse_kubeconfig(from_file, dir_ / "kubeconfig-file");
  EXPECT_EQ(c.tls.ca_file, dir_ / "certs/cluster-ca.crt");
  EXPECT_TRUE(KubernetesBackend(c, "").list_jobs().empty());
  const Json log = requests();
  ASSERT_EQ(log["requests"].size(), 2u) << log.dump(1);
  for (const Json& r : log["requests"]) {
    EXPECT_EQ(r["tls"], true);
    EXPECT_EQ(r["method"], "GET");
    EXPECT_EQ(r["path"], "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs");
    EXPECT_EQ(r["headers"]["authorization"], "Bearer " + kToken);
    EXPECT_EQ(r["headers"]["accept"], "application/json");
    EXPECT_EQ(r["client_cn"], "");
  }
  EXPECT_TRUE(log["tls_failures"].empty()) << log["tls_failures"].dump();
}

// A server that requires client certificates: the user's certificate and key, inline or as
// files, authenticate without a token; no certificate, or one another CA signed, is refused at
// the handshake with an error that says so.
TEST_F(KubernetesBackendTest, ClientCertificatesAuthenticateAsDataOrFiles) {
  TempDir dir;
  auto strict = start_server(dir / "pki", "required");
  ASSERT_TRUE(strict->ready());
  const std::string server = "https://127.0.0.1:" + std::to_string(strict->port());
  const int control_port = strict->info().value("control_port", 0);
  auto read = [&](const std::string& name) { return hub::testing::read_file(dir / ("pki/" + name)); };
  const std::string ca = "    certificate-authority-data: " + hub::base64_encode(read("ca.crt")) + "\n";
  const std::string path = dir / "config";

  const KubeConnection inline_cert = parse_kubeconfig(
      kubeconfig_yaml(server, ca, "    client-certificate-data: " + hub::base64_encode(read("client.crt")) + "\n" +
                                      "    client-key-data: " + hub::base64_encode(read("client.key")) + "\n"),
      path);
  EXPECT_TRUE(inline_cert.bearer_token.empty());
  EXPECT_TRUE(KubernetesBackend(inline_cert, "").list_jobs().empty());
  write_file(dir / "user/tester.crt", read("client.crt"));
  write_file(dir / "user/tester.key", read("client.key"));
  const KubeConnection file_cert = parse_kubeconfig(
      kubeconfig_yaml(server, ca, "    client-certificate: user/tester.crt\n    client-key: user/tester.key\n"), path);
  EXPECT_TRUE(KubernetesBackend(file_cert, "").list_jobs().empty());
  Json log = control(control_port, "GET", "/_test/requests");
  ASSERT_EQ(log["requests"].size(), 2u) << log.dump(1);
  for (const Json& r : log["requests"]) {
    EXPECT_EQ(r["client_cn"], "tester");  // the certificate the server verified
    EXPECT_FALSE(r["headers"].contains("authorization"));
  }

  // A token alone does not pass a server that requires a certificate.
  const std::string no_cert = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca, "    token: " + kToken + "\n"), path), "").list_jobs();
  });
  EXPECT_NE(no_cert.find("cannot reach the API server " + server + " (kubeconfig " + path + " (context fake))"),
            std::string::npos) << no_cert;
  EXPECT_NE(no_cert.find("refused the TLS client certificate"), std::string::npos) << no_cert;
  EXPECT_EQ(no_cert.find(kToken), std::string::npos);
  // A certificate from a CA the cluster does not trust.
  const std::string untrusted = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca,
                                                       "    client-certificate-data: " + hub::base64_encode(read("other-client.crt")) +
                                                           "\n    client-key-data: " + hub::base64_encode(read("other-client.key")) + "\n"),
                                       path),
                      "")
        .list_jobs();
  });
  EXPECT_NE(untrusted.find("refused the TLS client certificate"), std::string::npos) << untrusted;
  log = control(control_port, "GET", "/_test/requests");
  EXPECT_EQ(log["requests"].size(), 2u) << "a refused handshake reached the API";
  EXPECT_FALSE(log["tls_failures"].empty());
  // A key file that is not there: named, not a handshake mystery.
  const std::string missing_key = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server, ca, "    client-certificate: user/tester.crt\n    client-key: user/nope.key\n"), path),
                      "")
        .list_jobs();
  });
  EXPECT_NE(missing_key.find("cannot reach the API server " + server), std::string::npos) << missing_key;
  EXPECT_NE(missing_key.find("client certificate or key"), std::string::npos) << missing_key;
}

// A server whose certificate the kubeconfig's CA did not sign is refused before any request is
// sent (so the token never leaves), with an error naming the server, the kubeconfig and the fix;
// without a CA the system's store does not trust it either. insecure-skip-tls-verify is honoured.
TEST_F(KubernetesBackendTest, AWrongCaIsRefusedUnlessVerificationIsSkipped) {
  const std::string wrong_ca = "    certificate-authority-data: " + hub::base64_encode(pem("other-ca.crt")) + "\n";
  const std::string token = "    token: " + kToken + "\n";
  const std::string wrong = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), wrong_ca, token), kubeconfig_), "").list_jobs();
  });
  EXPECT_NE(wrong.find("cannot reach the API server " + server_url() + " (kubeconfig " + kubeconfig_ + " (context fake))"),
            std::string::npos) << wrong;
  EXPECT_NE(wrong.find("does not verify against the CA this kubeconfig gives"), std::string::npos) << wrong;
  EXPECT_NE(wrong.find("insecure-skip-tls-verify"), std::string::npos) << wrong;
  EXPECT_EQ(wrong.find(kToken), std::string::npos);
  const std::string system_cas = error_of([&] {
    KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), "", token), kubeconfig_), "").list_jobs();
  });
  EXPECT_NE(system_cas.find("does not verify against the CA"), std::string::npos) << system_cas;
  EXPECT_TRUE(requests()["requests"].empty()) << "a request went to a server that was not verified";

  // The same from the shell: exit 1, the message, no token.
  if (fs::exists(kKtune)) {
    write_file(dir_ / "wrong-kubeconfig", kubeconfig_yaml(server_url(), wrong_ca, token));
    std::vector<std::string> argv{kKtune, "jobs", "list", "--backend", "kubernetes"};
    const CommandResult r = run_command(argv, {{"KUBECONFIG", dir_ / "wrong-kubeconfig"}, {"KTUNE_HOME", dir_ / "home"}});
    EXPECT_EQ(r.exit_code, 1);
    EXPECT_NE(r.err.find("does not verify against the CA"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(dir_ / "wrong-kubeconfig"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find(kToken), std::string::npos) << r.err;
  }

  // insecure-skip-tls-verify: the wrong CA, or none, is not checked.
  for (const std::string& cluster : {wrong_ca + "    insecure-skip-tls-verify: true\n", std::string("    insecure-skip-tls-verify: true\n")})
    EXPECT_TRUE(KubernetesBackend(parse_kubeconfig(kubeconfig_yaml(server_url(), cluster, token), kubeconfig_), "")
                    .list_jobs()
                    .empty());
  EXPECT_EQ(requests()["requests"].size(), 2u);
}

// Inside a pod: the service account's token and ca.crt, over TLS.
TEST_F(KubernetesBackendTest, TheInClusterServiceAccountSpeaksTls) {
  write_file(dir_ / "sa/token", kToken + "\n");
  write_file(dir_ / "sa/ca.crt", pem("ca.crt"));
  write_file(dir_ / "sa/namespace", "team-a\n");
  KubernetesBackend k(in_cluster_connection("127.0.0.1", std::to_string(port_), dir_ / "sa"), "");
  EXPECT_EQ(k.kubernetes_namespace(), "team-a");
  EXPECT_TRUE(k.list_jobs().empty());
  const Json log = requests();
  ASSERT_EQ(log["requests"].size(), 1u);
  EXPECT_EQ(log["requests"][0]["headers"]["authorization"], "Bearer " + kToken);
  EXPECT_EQ(log["requests"][0]["tls"], true);
}

// Plain HTTP still works: what `kubectl proxy` serves on localhost.
TEST(KubernetesBackendPlainHttp, AKubectlProxyStyleServerIsSpokenToWithoutTls) {
  TempDir dir;
  auto plain = start_server("");
  ASSERT_TRUE(plain->ready());
  const std::string config = kubeconfig_yaml("http://127.0.0.1:" + std::to_string(plain->port()), "", "    token: " + kToken + "\n");
  EXPECT_TRUE(KubernetesBackend(parse_kubeconfig(config, dir / "config"), "").list_jobs().empty());
  const Json log = control(plain->info().value("control_port", 0), "GET", "/_test/requests");
  ASSERT_EQ(log["requests"].size(), 1u);
  EXPECT_EQ(log["requests"][0]["tls"], false);
}

// --- Followed logs that the server cuts or ends early ----------------------------------------

struct FollowedLog {
  std::vector<std::string> lines, log_paths;
};

class KubernetesLogStreamTest : public KubernetesBackendTest {
 protected:
  // A running node pod of job `job` whose log is `log` (the fake server's LOG spec); follows it.
  FollowedLog follow(const std::string& job, Json log) {
    FollowedLog out;
    if (submit(job) != job) return out;
    const Json node = pod(job, "node", 0, "Running", "2026-12-02T10:02:00Z");
    const std::string pod_name = node["metadata"]["name"];
    set_state({{"pods", {{job, Json::array({node})}}}, {"logs", {{pod_name + "/node", log}}}});
    KubernetesBackend k = backend();
    k.set_poll_interval(0.01);
    k.get_job_logs(job, "node-0", true, [&](const std::string& l) {
      out.lines.push_back(l);
      return true;
    });
    const Json recorded = requests();
    for (const Json& r : recorded["requests"]) {
      const std::string path = r["path"];
      if (path.find("/log?") != std::string::npos) out.log_paths.push_back(path.substr(path.find("/log?") + 5));
    }
    return out;
  }
};

std::vector<std::string> numbered_lines(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back("line " + std::to_string(i) + ": loss " + std::to_string(2.5 - 0.1 * i));
  return v;
}

// Cut mid-line after the second of three lines that share one timestamp, then ended early by the
// server while the container still runs: each time the stream is reopened from the last line's
// second, and every line arrives exactly once, in order.
TEST_F(KubernetesLogStreamTest, ACutOrEarlyEndedStreamIsReopenedWithoutRepeatsOrGaps) {
  const std::vector<std::string> lines = numbered_lines(10);
  const Json times = Json::array({"2026-12-02T10:02:00.1Z", "2026-12-02T10:02:00.5Z", "2026-12-02T10:02:01Z",
                                  "2026-12-02T10:02:01.5Z", "2026-12-02T10:02:01.5Z", "2026-12-02T10:02:01.5Z",
                                  "2026-12-02T10:02:01.9Z", "2026-12-02T10:02:02.3Z", "2026-12-02T10:02:03Z",
                                  "2026-12-02T10:02:03.000000001Z"});
  const FollowedLog got = follow("job-cut", {{"lines", lines},
                                             {"times", times},
                                             {"drops", Json::array({{{"at", 5}, {"how", "reset"}, {"partial", true}},
                                                                    {{"at", 8}, {"how", "clean"}}})}});
  EXPECT_EQ(got.lines, lines);
  EXPECT_EQ(got.log_paths, (std::vector<std::string>{"container=node&timestamps=true&follow=true",
                                                     "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A01Z&follow=true",
                                                     "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A02Z&follow=true"}));
}

// The stream is cut and the container exits before it could be reopened: the rest is read once,
// without follow, from where the cut left off.
TEST_F(KubernetesLogStreamTest, ACutStreamOfAContainerThatEndedMeanwhileIsReadToItsEnd) {
  const std::vector<std::string> lines = numbered_lines(7);
  const FollowedLog got =
      follow("job-end", {{"lines", lines}, {"drops", Json::array({{{"at", 4}, {"partial", true}, {"container_ends", true}}})}});
  EXPECT_EQ(got.lines, lines);
  ASSERT_EQ(got.log_paths.size(), 2u);
  EXPECT_EQ(got.log_paths[1], "container=node&timestamps=true&sinceTime=2026-12-02T10%3A02%3A01Z");  // no follow
}

// A stream that keeps failing without a new line gives up with the reason instead of looping.
TEST_F(KubernetesLogStreamTest, AStreamThatKeepsFailingGivesUpWithTheReason) {
  Json drops = Json::array();
  for (int i = 0; i < 8; ++i) drops.push_back({{"at", 2}});
  std::string error;
  FollowedLog got;
  try {
    got = follow("job-flaky", {{"lines", numbered_lines(4)}, {"drops", drops}});
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("keeps failing (5 attempts without a new line)"), std::string::npos) << error;
  EXPECT_EQ(requests()["requests"].back()["method"], "GET");
}

}  // namespace
}  // namespace ktune::sdk
