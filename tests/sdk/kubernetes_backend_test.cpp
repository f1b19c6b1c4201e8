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
// test sets. This file: the kubeconfig readers, submit, status, logs, errors and the CLI; TLS is
// in kube_tls_test.cpp, cut and reopened log streams in kube_log_stream_test.cpp.
#include "kube_test_support.h"

#include <regex>
#include <thread>

namespace ktune::sdk {
namespace {

using namespace kube_testing;  // NOLINT: the shared fixture and helpers (fs, Json, TempDir, write_file, run_command)

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
// On Kubernetes the runtimes are the cluster's, read at each call as upstream's SDK reads them: a
// runtime changed on the cluster is seen as changed by a client made before, one removed is no longer
// offered (the error says how ktune's install), and making a client reads nothing yet.
TEST_F(KubernetesBackendTest, TheRuntimesAreTheClustersAsOfEachCall) {
  BackendConfig config;
  config.kind = BackendConfig::Kind::Kubernetes;
  config.kubeconfig = kubeconfig_;
  TrainerClient client(config);
  const Json seen = requests();  // named: a range-for over a temporary's element would read freed memory
  for (const Json& r : seen["requests"])
    EXPECT_EQ(r["path"].get<std::string>().find("trainingruntimes"), std::string::npos) << "read when the client was made";
  EXPECT_EQ(client.get_runtime("torchtune-llama3.3-70b").trainer.image.find("ghcr.io/ktune/"), 0u);
  Json custom = Json::parse(v1alpha1::to_json(RuntimeCatalog::builtin().get("torchtune-llama3.3-70b")).dump());
  custom["spec"]["mlPolicy"]["numNodes"] = 2;
  for (Json& rj : custom["spec"]["template"]["spec"]["replicatedJobs"])
    for (Json& c : rj["template"]["spec"]["template"]["spec"]["containers"])
      if (c["name"] == "node") c["image"] = "registry.example/ktune-trainer:dev";
  set_state({{"runtimes", {{"torchtune-llama3.3-70b", custom}, {"torchtune-qwen2.5-7b", nullptr}}}});
  EXPECT_EQ(client.get_runtime("torchtune-llama3.3-70b").trainer.image, "registry.example/ktune-trainer:dev");
  try {
    client.get_runtime("torchtune-qwen2.5-7b");
    FAIL() << "a runtime the cluster lacks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not found on the cluster"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("kubectl apply --server-side -k manifests/"), std::string::npos) << e.what();
  }
  const std::vector<types::Runtime> listed = client.list_runtimes();
  EXPECT_TRUE(std::none_of(listed.begin(), listed.end(), [](const types::Runtime& r) { return r.name == "torchtune-qwen2.5-7b"; }));
  types::TorchTuneConfig cfg;
  cfg.epochs = 1;
  const std::string name = client.train(client.get_runtime("torchtune-llama3.3-70b"), nullptr, types::BuiltinTrainer{cfg});
  const TrainJobRecord r = client.get_job_record(name);
  EXPECT_EQ(r.num_nodes, 2);
  EXPECT_EQ(r.trainer_type, "BuiltinTrainer");
}

// A namespaced TrainingRuntime of a ClusterTrainingRuntime's name is the one offered (upstream's
// precedence), and a TrainJob refers to it by its kind. Not allowed to list the namespace's
// runtimes (RBAC): the cluster's serve; any other failure to list is an error, as upstream's.
TEST_F(KubernetesBackendTest, ANamespacedRuntimeOfAClusterRuntimesNameIsTheOneOffered) {
  BackendConfig config;
  config.kind = BackendConfig::Kind::Kubernetes;
  config.kubeconfig = kubeconfig_;
  TrainerClient client(config);
  Json team = Json::parse(v1alpha1::to_json(RuntimeCatalog::builtin().get("torchtune-llama3.2-1b")).dump());
  team["kind"] = v1alpha1::kTrainingRuntimeKind;
  team["metadata"]["namespace"] = "team-a";  // the kubeconfig context's
  for (Json& rj : team["spec"]["template"]["spec"]["replicatedJobs"])
    for (Json& c : rj["template"]["spec"]["template"]["spec"]["containers"])
      if (c["name"] == "node") c["image"] = "registry.example/team-trainer:1";
  Json elsewhere = team;
  elsewhere["metadata"]["name"] = "other-namespace-runtime";
  elsewhere["metadata"]["namespace"] = "team-b";
  set_state({{"namespaced_runtimes", {{"torchtune-llama3.2-1b", team}, {"other-namespace-runtime", elsewhere}}}});
  const types::Runtime offered = client.get_runtime("torchtune-llama3.2-1b");
  EXPECT_EQ(offered.trainer.image, "registry.example/team-trainer:1");
  EXPECT_EQ(offered.kind, types::RuntimeKind::TrainingRuntime);
  const std::vector<types::Runtime> listed = client.list_runtimes();
  EXPECT_EQ(std::count_if(listed.begin(), listed.end(), [](const types::Runtime& r) { return r.name == "torchtune-llama3.2-1b"; }), 1);
  EXPECT_TRUE(std::none_of(listed.begin(), listed.end(), [](const types::Runtime& r) { return r.name == "other-namespace-runtime"; }));
  types::TorchTuneConfig cfg;
  cfg.epochs = 1;
  const std::string name = client.train(offered, nullptr, types::BuiltinTrainer{cfg});
  const Json posted = requests()["trainjobs"]["team-a"].at(name);
  EXPECT_EQ(posted["spec"]["runtimeRef"]["kind"], "TrainingRuntime") << posted.dump();
  client.delete_job(name);

  set_state({{"errors", Json::array({{{"method", "GET"}, {"path", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainingruntimes"},
                                      {"status", 403}, {"reason", "Forbidden"}, {"message", "cannot list trainingruntimes"}}})}});
  EXPECT_EQ(client.get_runtime("torchtune-llama3.2-1b").kind, types::RuntimeKind::ClusterTrainingRuntime);
  set_state({{"errors", Json::array({{{"method", "GET"}, {"path", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes"},
                                      {"status", 500}, {"reason", "InternalError"}, {"message", "etcd is down"}}})}});
  try {
    client.list_runtimes();
    FAIL() << "a failed listing was taken for an empty one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("etcd is down"), std::string::npos) << e.what();
  }
  set_state({{"errors", Json::array()}, {"namespaced_runtimes", {{"torchtune-llama3.2-1b", nullptr}, {"other-namespace-runtime", nullptr}}}});
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
  const types::TrainJob done = client.wait_for_job_status("job-a", {"Complete"}, 10, 0.1);
  EXPECT_EQ(done.status, "Complete");
  ASSERT_EQ(done.steps.size(), 1u);
  EXPECT_EQ(done.steps[0].pod_name, "job-a-node-0-0-00");  // the pod, as upstream's Step.pod_name
  EXPECT_EQ(done.steps[0].status, "Running");  // the pod's phase, as upstream's Step.status on Kubernetes
  EXPECT_THROW(client.wait_for_job_status("job-b", {"Complete"}, 0.5, 0.1), WaitTimeoutError);
  // Deleting removes the job and its Secret.
  client.delete_job("job-a");
  EXPECT_THROW(k.get_job("job-a"), Error);
  EXPECT_FALSE(requests()["secrets"].contains("job-a-ktune-secrets"));
}

// The trainer reports its progress as Kubeflow Trainer's status server takes it (KEP-2779): the real
// `ktune run` of the quickstart's tiny model, given the env the controller injects (the status URL
// of this job, the controller's CA, a projected token file), POSTs trainerStatus over TLS with the
// token as bearer; the status server (the fake, validating as the controller's API types do) puts
// it into the TrainJob's status, where the backend's get_job reads 100% at the end. A token the
// endpoint refuses costs one warning and no training: the run still completes, and the token is in
// no output.
TEST_F(KubernetesBackendTest, TheTrainerReportsItsProgressIntoTheTrainJobsStatus) {
  if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  ASSERT_EQ(submit("job-s"), "job-s");
  const std::string source = KTUNE_SOURCE_DIR;
  const std::string model = dir_ / "model";
  CommandResult init = run_command({kKtune, "init-model", "--config", source + "/examples/quickstart/config.json",
                                    "--output-dir", model, "--seed", "0", "--copy",
                                    source + "/examples/quickstart/tokenizer.json", "--copy",
                                    source + "/examples/quickstart/tokenizer_config.json"},
                                   {});
  ASSERT_EQ(init.exit_code, 0) << init.err;
  write_file(dir_ / "status-token", kStatusToken + "\n");
  write_file(dir_ / "wrong-token", "not-a-pod-token\n");
  auto train = [&](const std::string& token_file, const std::string& out) {
    return run_command(
        {kKtune, "run", "full_finetune_single_device", "--config", "tiny/full_single_device",
         "checkpointer.checkpoint_dir=" + model, "tokenizer.path=" + model + "/tokenizer.json",
         "dataset.source=parquet", "dataset.data_files=" + source + "/data/quickstart/data/train-00000-of-00001.parquet",
         "output_dir=" + (dir_ / out), "epochs=1", "max_steps_per_epoch=4", "batch_size=4"},
        {{"KUBEFLOW_TRAINER_SERVER_URL",
          server_url() + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/job-s/status"},
         {"KUBEFLOW_TRAINER_SERVER_CA_CERT", pki_ + "/ca.crt"},
         {"KUBEFLOW_TRAINER_SERVER_TOKEN", dir_ / token_file},
         {"KTUNE_TRAINER_STATUS_INTERVAL_SECONDS", "0"},
         {"KTUNE_NUM_THREADS", "1"}});
  };
  auto status_posts = [&]() {
    std::vector<Json> posts;
    const Json recorded = requests();  // named: a range-for over a temporary's member would dangle
    for (const Json& r : recorded["requests"])
      if (r["method"] == "POST" && r["path"].get<std::string>().ends_with("/trainjobs/job-s/status")) posts.push_back(r);
    return posts;
  };

  const CommandResult run = train("status-token", "out");
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  EXPECT_EQ((run.out + run.err).find("trainer status:"), std::string::npos) << run.err;  // no warning
  const std::vector<Json> posts = status_posts();
  ASSERT_GE(posts.size(), 2u);  // the first step's at once, the last one's at once
  ASSERT_LE(posts.size(), 4u);  // at most one a step
  int64_t last_percent = -1;
  for (const Json& p : posts) {
    EXPECT_TRUE(p["tls"].get<bool>());
    EXPECT_EQ(p["headers"]["authorization"], "Bearer " + kStatusToken);
    EXPECT_EQ(p["headers"]["content-type"], "application/json");
    const int64_t percent = p["body"]["trainerStatus"]["progressPercentage"];
    EXPECT_GE(percent, last_percent);
    last_percent = percent;
  }
  EXPECT_EQ(last_percent, 100);
  const TrainJobRecord r = backend().get_job("job-s");
  ASSERT_TRUE(r.progress.present);
  EXPECT_EQ(r.progress.progress_percentage, 100);
  EXPECT_EQ(r.progress.estimated_remaining_seconds, 0);
  EXPECT_GT(r.progress.metrics.at("loss"), 0);
  EXPECT_GT(r.progress.metrics.at("lr"), 0);
  EXPECT_EQ(r.progress.metrics.at("currentStep"), 4);
  EXPECT_EQ(r.progress.metrics.at("totalSteps"), 4);
  EXPECT_EQ(r.progress.metrics.at("currentEpoch"), 1);
  EXPECT_EQ(r.progress.metrics.at("totalEpochs"), 1);

  // A token the endpoint refuses: one POST, one warning naming the answer, the run completes.
  const CommandResult refused = train("wrong-token", "out-refused");
  ASSERT_EQ(refused.exit_code, 0) << refused.out << refused.err;
  const std::string said = refused.out + refused.err;
  EXPECT_NE(said.find("trainer status: " + server_url() + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/"
                      "trainjobs/job-s/status did not take the run's status (HTTP 401"),
            std::string::npos)
      << said;
  EXPECT_EQ(status_posts().size(), posts.size() + 1);
  EXPECT_TRUE(fs::exists(dir_ / "out-refused/epoch_0"));
  for (const std::string& text : {run.out, run.err, refused.out, refused.err})
    EXPECT_EQ(text.find(kStatusToken), std::string::npos);
}

// `ktune export --job` on the cluster: the exporter runs as a batch/v1 Job beside the TrainJob's
// volume (the runtime's claim template, JobSet's claim name, mounted read-only where the trainer had
// it), in the runtime's initializer image, its S3 keys from a Secret owned by the TrainJob; the CLI
// follows the export pod's log and prints the exporter's summary, and the export is recorded in the
// TrainJob's annotation, which get_job and `ktune jobs get` read back. A second export replaces the
// finished Job; a failed one is recorded with the exporter's last line. Refused: a job that is not
// Complete, a file:// destination (it would be written inside the pod).
// The SDK's export on a cluster waits for the export Job's pod to leave Pending; the request's
// while_waiting runs between the polls, and what it throws (the Python SDK's Ctrl-C) ends the wait.
TEST_F(KubernetesBackendTest, AnExportsWaitForItsPodRunsTheCallersHookBetweenPolls) {
  ASSERT_EQ(submit("job-w"), "job-w");
  set_state({{"status", {{"job-w", {{"conditions", Json::array({{{"type", "Complete"}, {"status", "True"}}})}}}}}});
  KubernetesBackend k = backend();
  k.set_poll_interval(0.01);
  ExportRequest request;
  request.destination = "s3://bucket/models/w";
  int waits = 0;
  request.while_waiting = [&] {
    if (++waits == 3) throw std::runtime_error("interrupted by the caller");
  };
  try {
    k.export_job("job-w", request, nullptr);
    FAIL() << "the wait did not run the hook, or swallowed what it threw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "interrupted by the caller");
  }
  EXPECT_EQ(waits, 3);
  EXPECT_TRUE(requests()["batchjobs"].contains("job-w-export"));  // the Job was made; it is left to run
}

// This machine's AWS profile (~/.aws) fills an export's unset S3 settings before they are shipped:
// its keys go to the export Secret, its region to the pod's env; a role the profile assumes is
// refused before anything is made (the pod could not assume it without this machine's credentials).
TEST_F(KubernetesBackendTest, AnExportShipsTheAwsProfilesKeysAndRefusesItsRole) {
  ASSERT_EQ(submit("job-p"), "job-p");
  set_state({{"status", {{"job-p", {{"conditions", Json::array({{{"type", "Complete"}, {"status", "True"}}})}}}}}});
  write_file(dir_ / "aws-config", "[profile keys]\nregion = ap-east-1\n[profile role]\nrole_arn = "
                                  "arn:aws:iam::1:role/r\nsource_profile = keys\n");
  write_file(dir_ / "aws-credentials", "[keys]\naws_access_key_id = AKIAPROFILEKEY000001\n"
                                       "aws_secret_access_key = profileSecretValue0123456789\n");
  KubernetesBackend k = backend();
  k.set_poll_interval(0.01);
  ExportRequest request;
  request.destination = "s3://bucket/models/p";
  request.storage.s3.profile = {"role", true, dir_ / "aws-config", dir_ / "aws-credentials"};
  try {
    k.export_job("job-p", request, nullptr);
    FAIL() << "a profile's role was shipped";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("AWS profile 'role' assumes role arn:aws:iam::1:role/r"), std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(requests()["batchjobs"].contains("job-p-export")) << "refused before anything was made";
  request.storage.s3.profile.name = "keys";
  request.while_waiting = [] { throw std::runtime_error("made; stop waiting"); };
  EXPECT_THROW(k.export_job("job-p", request, nullptr), std::runtime_error);
  const Json state = requests();
  EXPECT_EQ(state["secrets"]["job-p-export-secrets"]["stringData"]["AWS_ACCESS_KEY_ID"], "AKIAPROFILEKEY000001");
  const std::string spec = state["batchjobs"]["job-p-export"].dump();
  EXPECT_NE(spec.find("ap-east-1"), std::string::npos) << "the profile's region as the pod's AWS_REGION";
  EXPECT_EQ(spec.find("profileSecretValue"), std::string::npos) << "the secret only in the Secret";
}

TEST_F(KubernetesBackendTest, ExportRunsAsAJobBesideTheTrainJobsVolumeAndIsRecorded) {
  if (!fs::exists(kKtune)) GTEST_SKIP() << "the ktune binary is not built at " << kKtune;
  ASSERT_EQ(submit("job-e"), "job-e");
  ASSERT_EQ(submit("job-r"), "job-r");
  set_state({{"status", {{"job-e", {{"conditions", Json::array({{{"type", "Complete"}, {"status", "True"}}})}}}}}});
  const std::map<std::string, std::string> aws = {{"AWS_ACCESS_KEY_ID", "AKIAEXPORTKEY0000001"},
                                                   {"AWS_SECRET_ACCESS_KEY", "exportSecretKeyValue0123456789"},
                                                   {"AWS_REGION", "eu-west-1"},
                                                   {"AWS_ENDPOINT_URL", "https://s3.example.com"}};
  auto wait_for = [&](const std::function<bool(const Json&)>& done) {
    for (int i = 0; i < 3000; ++i) {
      if (done(requests())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  };
  // The export Job's pod as the Job controller labels it (the old one stays: pods go away late).
  Json export_pods = Json::array();
  auto export_pod = [&](const std::string& pod_name, const std::string& phase, const Json& lines) {
    const std::string uid = requests()["batchjobs"]["job-e-export"]["metadata"]["uid"];
    export_pods.push_back({{"metadata", {{"name", pod_name},
                                         {"namespace", "team-a"},
                                         {"creationTimestamp", "2026-12-02T11:00:00Z"},
                                         {"labels", {{"batch.kubernetes.io/job-name", "job-e-export"},
                                                     {"batch.kubernetes.io/controller-uid", uid}}}}},
                           {"status", {{"phase", phase}}}});
    set_state({{"pods", {{"job-e-export", export_pods}}}, {"logs", {{pod_name + "/exporter", {{"lines", lines}}}}}});
  };

  // The CLI runs beside the test's own requests; a jthread joins however the test ends (a failed
  // ASSERT returns early).
  CommandResult first;
  std::jthread cli([&] {
    first = ktune({"export", "--job", "job-e", "--to", "s3://bucket/models/run1", "--parts", "adapter", "--backend",
                   "kubernetes", "--timeout", "120", "--role-arn", "arn:aws:iam::1:role/exporter"},
                  aws);
  });
  // The Job is made, then the export recorded in the TrainJob's annotation: wait for both.
  ASSERT_TRUE(wait_for([](const Json& r) {
    return r["batchjobs"].contains("job-e-export") &&
           r["trainjobs"]["team-a"]["job-e"]["metadata"].value("annotations", Json::object()).contains("ktune.dev/exports");
  }));
  const Json state = requests();
  const Json& job = state["batchjobs"]["job-e-export"];
  EXPECT_EQ(job["metadata"]["ownerReferences"][0]["kind"], "TrainJob");
  EXPECT_EQ(job["metadata"]["ownerReferences"][0]["name"], "job-e");
  EXPECT_EQ(job["metadata"]["ownerReferences"][0]["uid"], state["trainjobs"]["team-a"]["job-e"]["metadata"]["uid"]);
  EXPECT_EQ(job["spec"]["backoffLimit"], 0);
  const Json& pod_spec = job["spec"]["template"]["spec"];
  EXPECT_EQ(pod_spec["restartPolicy"], "Never");
  const Json& c = pod_spec["containers"][0];
  EXPECT_EQ(c["image"], "ghcr.io/ktune/ktune-initializer:0.1.0");  // the runtime's dataset initializer's
  EXPECT_EQ(c["command"], Json::array({"ktune", "export", "--from", "/workspace/output", "--to", "s3://bucket/models/run1",
                                       "--parts", "adapter", "--role-arn", "arn:aws:iam::1:role/exporter"}));
  EXPECT_EQ(c["volumeMounts"][0], Json({{"name", "workspace"}, {"mountPath", "/workspace"}, {"readOnly", true}}));
  EXPECT_EQ(pod_spec["volumes"][0]["persistentVolumeClaim"], Json({{"claimName", "workspace-job-e"}, {"readOnly", true}}));
  std::map<std::string, Json> env;
  for (const Json& e : c["env"]) env[e["name"]] = e;
  EXPECT_EQ(env["AWS_REGION"]["value"], "eu-west-1");
  EXPECT_EQ(env["AWS_ENDPOINT_URL"]["value"], "https://s3.example.com");
  EXPECT_EQ(env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"],
            Json({{"name", "job-e-export-secrets"}, {"key", "AWS_SECRET_ACCESS_KEY"}}));
  EXPECT_EQ(state["secrets"]["job-e-export-secrets"]["stringData"]["AWS_SECRET_ACCESS_KEY"], aws.at("AWS_SECRET_ACCESS_KEY"));
  EXPECT_EQ(state["secrets"]["job-e-export-secrets"]["metadata"]["ownerReferences"][0]["name"], "job-e");
  EXPECT_EQ(job.dump().find(aws.at("AWS_SECRET_ACCESS_KEY")), std::string::npos);
  const Json running = Json::parse(state["trainjobs"]["team-a"]["job-e"]["metadata"]["annotations"]["ktune.dev/exports"].get<std::string>());
  EXPECT_EQ(running[0]["status"], "Running");
  EXPECT_EQ(running[0]["destination"], "s3://bucket/models/run1");

  // The export pod runs and succeeds; the CLI prints the exporter's summary.
  const std::string summary = R"({"destination":"s3://bucket/models/run1","file_count":2,"bytes":300})";
  export_pod("job-e-export-abcde", "Succeeded", Json::array({"INFO: export: [1/2] adapter_model.safetensors 280 bytes", summary}));
  set_state({{"jobstatus", {{"job-e-export", {{"succeeded", 1}}}}}});
  cli.join();
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  EXPECT_EQ(Json::parse(first.out), Json::parse(summary));
  EXPECT_NE(first.err.find("adapter_model.safetensors 280 bytes"), std::string::npos) << first.err;
  TrainJobRecord r = backend().get_job("job-e");
  ASSERT_EQ(r.exports.size(), 1u);
  EXPECT_EQ(r.exports[0].status, "Complete");
  EXPECT_EQ(r.exports[0].parts, "adapter");
  EXPECT_EQ(Json::parse(r.exports[0].summary_json)["file_count"], 2);
  EXPECT_GE(r.exports[0].finished_at, r.exports[0].started_at);
  const CommandResult shown = ktune({"jobs", "get", "job-e", "--backend", "kubernetes"});
  EXPECT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_TRUE(std::regex_search(shown.out, std::regex("\n1 +Complete +adapter +2 +300 .*s3://bucket/models/run1"))) << shown.out;

  // A second export: the finished Job makes way; this one fails, with the exporter's last line.
  set_state({{"jobstatus", {{"job-e-export", nullptr}}}});
  CommandResult second;
  std::jthread again([&] {
    second = ktune({"export", "--job", "job-e", "--to", "s3://bucket/models/run2", "--backend", "kubernetes", "--timeout",
                    "120"},
                   aws);
  });
  ASSERT_TRUE(wait_for([](const Json& r) {
    for (const Json& q : r["requests"])
      if (q["method"] == "DELETE" && q["path"].get<std::string>().find("/jobs/job-e-export") != std::string::npos) return true;
    return false;
  }));
  ASSERT_TRUE(wait_for([](const Json& r) {
    return r["batchjobs"].contains("job-e-export") &&
           r["batchjobs"]["job-e-export"]["spec"]["template"]["spec"]["containers"][0]["command"][5] == "s3://bucket/models/run2";
  }));
  export_pod("job-e-export-fghij", "Failed",
             Json::array({"error: s3 PUT s3://bucket/models/run2/adapter_model.safetensors: HTTP 403 AccessDenied"}));
  set_state({{"jobstatus", {{"job-e-export", {{"failed", 1}}}}}});
  again.join();
  EXPECT_EQ(second.exit_code, 1) << second.out << second.err;
  EXPECT_NE(second.err.find("HTTP 403 AccessDenied"), std::string::npos) << second.err;
  r = backend().get_job("job-e");
  ASSERT_EQ(r.exports.size(), 2u);
  EXPECT_EQ(r.exports[1].id, 2);
  EXPECT_EQ(r.exports[1].status, "Failed");
  EXPECT_NE(r.exports[1].error.find("AccessDenied"), std::string::npos);
  for (const CommandResult* c2 : std::vector<const CommandResult*>{&first, &second, &shown})
    EXPECT_EQ((c2->out + c2->err).find(aws.at("AWS_SECRET_ACCESS_KEY")), std::string::npos);

  // An export nobody follows to its end (the CLI's --timeout): left Running while its Job runs, which
  // refuses another; once that Job is gone, the next export settles it as Failed and goes on.
  set_state({{"jobstatus", {{"job-e-export", nullptr}}}});
  const std::vector<std::string> third_args = {"export", "--job", "job-e", "--to", "s3://bucket/models/run3",
                                               "--backend", "kubernetes", "--timeout", "1"};
  const CommandResult third = ktune(third_args, aws);
  EXPECT_EQ(third.exit_code, 3) << third.err;
  EXPECT_NE(third.err.find("still runs after 1 s"), std::string::npos) << third.err;
  EXPECT_EQ(backend().get_job("job-e").exports.back().status, "Running");
  const CommandResult busy = ktune(third_args, aws);
  EXPECT_EQ(busy.exit_code, 1);
  EXPECT_NE(busy.err.find("export 3 to s3://bucket/models/run3 is still running"), std::string::npos) << busy.err;
  set_state({{"batchjobs", {{"job-e-export", nullptr}}}});
  const CommandResult fourth = ktune(third_args, aws);
  EXPECT_EQ(fourth.exit_code, 3) << fourth.err;
  r = backend().get_job("job-e");
  ASSERT_EQ(r.exports.size(), 4u);
  EXPECT_EQ(r.exports[2].status, "Failed");
  EXPECT_NE(r.exports[2].error.find("is gone; the export's end was not seen"), std::string::npos) << r.exports[2].error;
  EXPECT_EQ(r.exports[3].status, "Running");

  // Refused before anything is made.
  const CommandResult not_done = ktune({"export", "--job", "job-r", "--to", "s3://b/p", "--backend", "kubernetes"}, aws);
  EXPECT_EQ(not_done.exit_code, 1);
  EXPECT_NE(not_done.err.find("only a Complete job's outputs are exported"), std::string::npos) << not_done.err;
  const CommandResult file = ktune({"export", "--job", "job-e", "--to", "file:///tmp/out", "--backend", "kubernetes"});
  EXPECT_EQ(file.exit_code, 1);
  EXPECT_NE(file.err.find("written inside the export pod"), std::string::npos) << file.err;
  EXPECT_FALSE(requests()["batchjobs"].contains("job-r-export"));
}

// An MPI runtime's job, as upstream's SDK shows it: the launcher is node-0 and worker i node-(i+1),
// and the launcher counts among numNodes for the job's status; the runtime's device count is
// mpi.numProcPerNode a node.
TEST_F(KubernetesBackendTest, AnMpiJobsLauncherIsNodeZeroAndItsWorkersFollow) {
  std::string yaml;
  for (const EmbeddedManifest& m : embedded_manifests())
    if (std::string(m.text).find("name: torch-distributed\n") != std::string::npos) yaml = m.text;
  ASSERT_FALSE(yaml.empty());
  Json runtime = Json::parse(v1alpha1::parse_yaml_documents(yaml, "manifest")[0].dump());
  runtime["metadata"]["name"] = "mpi-rt";
  runtime["metadata"]["uid"] = "r-mpi";
  runtime["spec"]["mlPolicy"] = {{"numNodes", 3}, {"mpi", {{"numProcPerNode", 1}}}};
  set_state({{"runtimes", {{"mpi-rt", runtime}}}});
  BackendConfig config;
  config.kind = BackendConfig::Kind::Kubernetes;
  config.kubeconfig = kubeconfig_;
  TrainerClient client(config);
  types::CustomTrainer trainer;
  trainer.command = {"python", "train.py"};
  // The runtime's devices as upstream's get_runtime_trainer counts them: mpi.numProcPerNode (here 1)
  // a node, times numNodes.
  EXPECT_EQ(client.get_runtime("mpi-rt").trainer.device_count, "3");
  const std::string name = client.train(client.get_runtime("mpi-rt"), nullptr, trainer, {.name = "mpi-job"});
  set_state({{"pods",
              {{name, Json::array({pod(name, "launcher", 0, "Running", "2026-12-02T10:02:00Z"),
                                   pod(name, "node", 0, "Running", "2026-12-02T10:02:01Z"),
                                   pod(name, "node", 1, "Running", "2026-12-02T10:02:02Z")})}}}});
  const types::TrainJob job = client.get_job(name);
  EXPECT_EQ(job.status, "Running");
  ASSERT_EQ(job.steps.size(), 3u);
  EXPECT_EQ(job.steps[0].name, "node-0");
  EXPECT_EQ(job.steps[0].pod_name, name + "-launcher-0-0-00");
  EXPECT_EQ(job.steps[1].name, "node-1");
  EXPECT_EQ(job.steps[1].pod_name, name + "-node-0-0-01");
  EXPECT_EQ(job.steps[2].name, "node-2");
}

// get_job_events: the namespace's events about the TrainJob, its JobSet, its Jobs and pods, oldest
// first (upstream's filter, plus the JobSet's Jobs); other jobs' events, other kinds and events
// without a firstTimestamp are left out; a job that is not there is named.
TEST_F(KubernetesBackendTest, JobEventsAreTheJobsObjectsOldestFirst) {
  ASSERT_EQ(submit("job-e"), "job-e");
  set_state({{"pods", {{"job-e", Json::array({pod("job-e", "node", 0, "Running", "2026-12-02T10:02:00Z")})}}}});
  auto event = [](const std::string& kind, const std::string& name, const std::string& reason, const std::string& first) {
    Json e = {{"metadata", {{"name", name + "." + reason}, {"namespace", "team-a"}}},
              {"involvedObject", {{"kind", kind}, {"name", name}, {"namespace", "team-a"}}},
              {"reason", reason},
              {"message", reason + " of " + name}};
    if (!first.empty()) e["firstTimestamp"] = first;
    return e;
  };
  set_state({{"events",
              {{"team-a", Json::array({event("Pod", "job-e-node-0-0-00", "Started", "2026-12-02T10:02:05Z"),
                                       event("TrainJob", "job-e", "Created", "2026-12-02T10:00:00Z"),
                                       event("Job", "job-e-node-0", "SuccessfulCreate", "2026-12-02T10:01:00Z"),
                                       event("JobSet", "job-e", "Suspended", "2026-12-02T10:00:30Z"),
                                       event("Pod", "other-node-0-0-00", "Started", "2026-12-02T10:02:01Z"),
                                       event("ConfigMap", "job-e-config", "Updated", "2026-12-02T10:00:10Z"),
                                       event("Pod", "job-e-node-0-0-01", "Pulled", "")})}}}});
  const std::vector<types::Event> events = backend().get_job_events("job-e");
  std::vector<std::string> got;
  for (const types::Event& e : events)
    got.push_back(e.event_time + " " + e.involved_object_kind + "/" + e.involved_object_name + " " + e.reason + ": " + e.message);
  EXPECT_EQ(got, (std::vector<std::string>{"2026-12-02T10:00:00Z TrainJob/job-e Created: Created of job-e",
                                           "2026-12-02T10:00:30Z JobSet/job-e Suspended: Suspended of job-e",
                                           "2026-12-02T10:01:00Z Job/job-e-node-0 SuccessfulCreate: SuccessfulCreate of job-e-node-0",
                                           "2026-12-02T10:02:05Z Pod/job-e-node-0-0-00 Started: Started of job-e-node-0-0-00"}));
  try {
    backend().get_job_events("no-such-job");
    FAIL() << "events of a job that is not there";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-job"), std::string::npos) << e.what();
  }
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
  // One stream, with timestamps (for a reopened stream to resume from); the container then ended
  // (the pod says so), and a last read from the last line's second finds nothing more.
  const std::string log_path = "/api/v1/namespaces/team-a/pods/" + pod_name + "/log?container=node&timestamps=true";
  EXPECT_EQ(log_paths, (std::vector<std::string>{log_path + "&follow=true", log_path + "&sinceTime=2026-12-02T10%3A02%3A01Z"}));
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
  // 409: the same name twice; the second Secret is refused first, and the error names the TrainJob
  // that holds the name (the Secret itself is left as it was).
  ASSERT_EQ(submit("dup"), "dup");
  const std::string dup = error_of([&] { submit("dup"); });
  EXPECT_NE(dup.find("TrainJob team-a/dup: 409 AlreadyExists: a TrainJob with this name already exists "
                     "(ktune jobs delete dup frees the name)"), std::string::npos) << dup;
  EXPECT_TRUE(requests()["secrets"].contains("dup-ktune-secrets"));
  // A Secret left without its TrainJob: named, with the command that frees the name.
  set_state({{"secrets", {{"orphan-ktune-secrets", {{"metadata", {{"name", "orphan-ktune-secrets"}}}}}}}});
  const std::string orphan = error_of([&] { submit("orphan"); });
  EXPECT_NE(orphan.find("409 AlreadyExists: secrets \"orphan-ktune-secrets\" already exists (no TrainJob orphan owns it: "
                        "kubectl delete secret orphan-ktune-secrets -n team-a frees the name)"), std::string::npos) << orphan;
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
  for (const std::string& text : {missing, dup, orphan, forbidden, unauthorized}) {
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
  set_state({{"events", {{"team-a", Json::array({{{"involvedObject", {{"kind", "Pod"}, {"name", node["metadata"]["name"]}}},
                                                   {"reason", "Pulled"},
                                                   {"message", "Container image pulled"},
                                                   {"firstTimestamp", "2026-12-02T10:02:03Z"}}})}}}});
  const CommandResult events = ktune({"jobs", "events", "cli-job", "--backend", "kubernetes"});
  ASSERT_EQ(events.exit_code, 0) << events.err;
  EXPECT_TRUE(std::regex_search(events.out, std::regex("TIME +KIND +NAME +REASON +MESSAGE *\n2026-12-02T10:02:03Z +Pod +cli-job-node-0-0-[0-9]+ +Pulled +Container image pulled")))
      << events.out;
  const CommandResult other_ns = ktune({"jobs", "get", "cli-job", "--backend", "kubernetes", "-n", "team-b"});
  EXPECT_EQ(other_ns.exit_code, 1);
  EXPECT_NE(other_ns.err.find("TrainJob team-b/cli-job"), std::string::npos) << other_ns.err;
  const CommandResult del = ktune({"jobs", "delete", "cli-job", "--backend", "kubernetes"});
  EXPECT_EQ(del.exit_code, 0) << del.err;
  // `ktune runtimes` takes the same flags: the cluster's runtimes, read from the API server.
  const CommandResult runtimes = ktune({"runtimes", "--backend", "kubernetes", "--namespace", "team-a"});
  ASSERT_EQ(runtimes.exit_code, 0) << runtimes.err;
  EXPECT_TRUE(std::regex_search(runtimes.out, std::regex("\ntorchtune-llama3.2-1b +builtin-trainer +torchtune "))) << runtimes.out;
  EXPECT_EQ(requests()["requests"].back()["path"], "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainingruntimes");
  const CommandResult one = ktune({"runtimes", "torchtune-llama3.2-1b", "--backend=kubernetes"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("kind: ClusterTrainingRuntime"), std::string::npos) << one.out;
  const CommandResult unknown = ktune({"runtimes", "--bogus"});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("ktune runtimes: unknown argument '--bogus'\nusage: ktune runtimes [NAME] [--backend local|kubernetes]"),
            std::string::npos) << unknown.err;
  for (const CommandResult* r : {&list, &get, &logs, &other_ns, &del, &runtimes, &one}) {
    EXPECT_EQ(r->out.find(kToken), std::string::npos);
    EXPECT_EQ(r->err.find(kToken), std::string::npos);
  }
}

}  // namespace
}  // namespace ktune::sdk
