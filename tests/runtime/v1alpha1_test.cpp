// Reading and writing the Trainer API objects: round trips, the unknown-field policy (Trainer
// fields refused with their path, embedded Kubernetes objects kept verbatim) and YAML typing.
#include <gtest/gtest.h>

#include "core/error.h"
#include "runtime/v1alpha1.h"

namespace ktune::v1alpha1 {
namespace {

const char* kTrainJob = R"(apiVersion: trainer.kubeflow.org/v1alpha1
kind: TrainJob
metadata:
  name: tune-llama
  namespace: tenant-alpha
  labels: {team: nlp}
  uid: 1234
spec:
  runtimeRef:
    name: torchtune-llama3.2-1b
  initializer:
    dataset:
      storageUri: hf://tatsu-lab/alpaca/data
      env:
        - name: ACCESS_TOKEN
          valueFrom: {secretKeyRef: {name: hf, key: token}}
    model:
      storageUri: hf://meta-llama/Llama-3.2-1B-Instruct
      secretRef: {name: hf-secret}
  trainer:
    command: [tune, run]
    args: [epochs=1, "model.lora_rank=8", "dataset.train_on_input=True"]
    env:
      - {name: LOG_LEVEL, value: "1"}
    numNodes: 1
    numProcPerNode: 2
    resourcesPerNode:
      limits: {nvidia.com/gpu: 2, memory: 16Gi}
      requests: {cpu: 500m}
  suspend: false
  activeDeadlineSeconds: 3600
status:
  conditions:
    - {type: Complete, status: "True", reason: JobsCompleted, message: done, lastTransitionTime: "2025-01-01T00:00:00Z"}
  trainerStatus:
    progressPercentage: 40
    estimatedRemainingSeconds: 120
    metrics: [{name: loss, value: "2.31"}]
)";

TrainJob parse_job(const std::string& text) {
  const auto docs = parse_yaml_documents(text, "job.yaml");
  EXPECT_EQ(docs.size(), 1u);
  return trainjob_from_json(docs.at(0), "job.yaml");
}

TEST(TrainJobYaml, ReadsEveryField) {
  const TrainJob j = parse_job(kTrainJob);
  EXPECT_EQ(j.metadata.name, "tune-llama");
  EXPECT_EQ(j.metadata.namespace_, "tenant-alpha");
  EXPECT_EQ(j.metadata.labels.at("team"), "nlp");
  EXPECT_EQ(j.metadata.extra["uid"], 1234);
  EXPECT_EQ(j.spec.runtime_ref.kind, "ClusterTrainingRuntime");  // defaulted
  EXPECT_EQ(*j.spec.initializer->dataset->storage_uri, "hf://tatsu-lab/alpaca/data");
  EXPECT_FALSE(j.spec.initializer->dataset->env[0].value);
  EXPECT_EQ(j.spec.initializer->dataset->env[0].value_from["secretKeyRef"]["key"], "token");
  EXPECT_EQ(*j.spec.initializer->model->secret_ref, "hf-secret");
  const Trainer& t = *j.spec.trainer;
  EXPECT_EQ(t.args, (std::vector<std::string>{"epochs=1", "model.lora_rank=8", "dataset.train_on_input=True"}));
  EXPECT_EQ(*t.env[0].value, "1");  // quoted: stays a string
  EXPECT_EQ(t.num_proc_per_node, "2");
  EXPECT_EQ(t.resources_per_node->limits.at("nvidia.com/gpu"), "2");
  EXPECT_EQ(t.resources_per_node->requests.at("cpu"), "500m");
  EXPECT_EQ(*j.spec.active_deadline_seconds, 3600);
  EXPECT_EQ(j.status->conditions[0].status, "True");
  EXPECT_EQ(*j.status->trainer_status->progress_percentage, 40);
  EXPECT_EQ(j.status->trainer_status->metrics[0].value, "2.31");
}

TEST(TrainJobYaml, RoundTripsUnchanged) {
  const TrainJob j = parse_job(kTrainJob);
  const std::string yaml = to_yaml(j);
  const TrainJob again = parse_job(yaml);
  EXPECT_EQ(to_json(again), to_json(j)) << yaml;
  // And the JSON form.
  EXPECT_EQ(to_json(trainjob_from_json(Json::parse(to_json(j).dump()), "job.json")), to_json(j));
}

TEST(TrainJobYaml, UnknownTrainerFieldIsRefusedWithItsPath) {
  std::string text = kTrainJob;
  text.replace(text.find("numNodes: 1"), 11, "numNode: 1");
  try {
    parse_job(text);
    FAIL() << "accepted numNode";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "job.yaml: spec.trainer.numNode");
    EXPECT_NE(std::string(e.what()).find("unknown field"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("numNodes"), std::string::npos) << "lists the known fields";
  }
}

TEST(TrainJobYaml, WrongTypesNameTheField) {
  std::string text = kTrainJob;
  text.replace(text.find("numNodes: 1"), 11, "numNodes: two");
  try {
    parse_job(text);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "job.yaml: spec.trainer.numNodes");
  }
  std::string env = kTrainJob;
  env.replace(env.find("value: \"1\""), 10, "value: 1");
  try {
    parse_job(env);
    FAIL() << "an unquoted number is not an env value";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "job.yaml: spec.trainer.env[0].value");
  }
}

TEST(TrainJobYaml, WrongKindOrApiVersionRefused) {
  std::string text = kTrainJob;
  text.replace(text.find("kind: TrainJob"), 14, "kind: PyTorchJob");
  EXPECT_THROW(parse_job(text), Error);
  std::string api = kTrainJob;
  api.replace(api.find("v1alpha1"), 8, "v1");
  EXPECT_THROW(parse_job(api), Error);
}

TEST(TrainJobYaml, AutoProcessesAreOmittedOnWrite) {
  TrainJob j;
  j.metadata.name = "a";
  j.spec.runtime_ref.name = "r";
  j.spec.trainer = Trainer{};
  j.spec.trainer->num_proc_per_node = "auto";
  const Json out = to_json(j);
  EXPECT_FALSE(out["spec"]["trainer"].contains("numProcPerNode"));
  j.spec.trainer->num_proc_per_node = "4";
  EXPECT_EQ(to_json(j)["spec"]["trainer"]["numProcPerNode"], 4);
}

TEST(YamlTyping, ScalarsFollowYamlCoreTypes) {
  const auto docs = parse_yaml_documents("a: 1\nb: \"1\"\nc: true\nd: 'true'\ne: 1.5\nf: ~\ng: 500m\nh: True\n", "x");
  const Json& d = docs.at(0);
  EXPECT_TRUE(d["a"].is_number_integer());
  EXPECT_TRUE(d["b"].is_string());
  EXPECT_TRUE(d["c"].is_boolean());
  EXPECT_TRUE(d["d"].is_string());
  EXPECT_TRUE(d["e"].is_number_float());
  EXPECT_TRUE(d["f"].is_null());
  EXPECT_TRUE(d["g"].is_string());
  EXPECT_TRUE(d["h"].is_boolean());
  // Strings that look like other types are quoted on the way out.
  const std::string out = to_yaml(Json{{"v", "1"}, {"w", "true"}, {"x", "plain"}, {"y", ""}});
  const Json back = parse_yaml_documents(out, "out").at(0);
  EXPECT_EQ(back, (Json{{"v", "1"}, {"w", "true"}, {"x", "plain"}, {"y", ""}})) << out;
}

TEST(YamlTyping, StringsWithYamlIndicatorsSurviveTheRoundTrip) {
  const std::vector<std::string> tricky{"{'input': 'x'}", "[q_proj,v_proj]", "*.msgpack,*.h5", "&anchor", "!tag",
                                        "%percent", "@at", "`tick", "- dash", "key: value", "#hash", "a #b",
                                        "line\nbreak", " lead", "trail ", "'single'", "\"double\"", "null", "~",
                                        "0x10", "1e3", ".5", "yes", "dataset.column_map={'input': \"it's\"}"};
  Json doc = Json::object();
  for (size_t i = 0; i < tricky.size(); ++i) doc["k" + std::to_string(i)] = tricky[i];
  doc["list"] = tricky;
  const std::string out = to_yaml(doc);
  EXPECT_EQ(parse_yaml_documents(out, "out").at(0), doc) << out;
}

TEST(YamlTyping, DuplicateKeysAndBadYamlNameTheLine) {
  try {
    parse_yaml_documents("a: 1\nb: [\n", "bad.yaml");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.where().find("bad.yaml:"), std::string::npos);
  }
  EXPECT_THROW(parse_yaml_documents("a: 1\na: 2\n", "dup.yaml"), Error);
}

const char* kRuntime = R"(apiVersion: trainer.kubeflow.org/v1alpha1
kind: ClusterTrainingRuntime
metadata:
  name: torchtune-llama3.2-1b
  labels: {trainer.kubeflow.org/framework: torchtune}
  annotations: {note: kept}
spec:
  mlPolicy:
    numNodes: 1
    torch:
      numProcPerNode: auto
  podGroupPolicy: {coscheduling: {scheduleTimeoutSeconds: 100}}
  template:
    spec:
      failurePolicy: {maxRestarts: 3}
      replicatedJobs:
        - name: node
          replicas: 1
          template:
            metadata:
              labels: {trainer.kubeflow.org/trainjob-ancestor-step: trainer}
            spec:
              template:
                spec:
                  nodeSelector: {gpu: a100}
                  containers:
                    - name: node
                      image: img
                      command: [tune, run]
                      resources: {limits: {nvidia.com/gpu: 2}}
)";

TEST(RuntimeYaml, EmbeddedKubernetesObjectsRoundTripVerbatim) {
  const TrainingRuntime rt = runtime_from_json(parse_yaml_documents(kRuntime, "rt.yaml").at(0), "rt.yaml");
  EXPECT_EQ(rt.framework(), "torchtune");
  EXPECT_EQ(rt.ml_policy.torch->num_proc_per_node, "auto");
  EXPECT_EQ(rt.pod_group_policy["coscheduling"]["scheduleTimeoutSeconds"], 100);
  const auto node = rt.find_replicated_job("trainer");
  ASSERT_TRUE(node);
  EXPECT_EQ(node->name, "node");
  EXPECT_EQ(node->find_container("node")->resources.limits.at("nvidia.com/gpu"), "2");
  const Json out = to_json(rt);
  EXPECT_EQ(out["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"], 3);
  EXPECT_EQ(out["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["nodeSelector"]["gpu"],
            "a100");
  const TrainingRuntime again = runtime_from_json(parse_yaml_documents(to_yaml(rt), "again").at(0), "again");
  EXPECT_EQ(to_json(again), out);
}

TEST(RuntimeYaml, TwoPoliciesOrUnknownPolicyFieldsRefused) {
  std::string two = kRuntime;
  two.replace(two.find("    torch:"), 10, "    mpi: {}\n    torch:");
  EXPECT_THROW(runtime_from_json(parse_yaml_documents(two, "x").at(0), "x"), Error);
  std::string unknown = kRuntime;
  unknown.replace(unknown.find("numProcPerNode: auto"), 20, "numProcsPerNode: auto");
  try {
    runtime_from_json(parse_yaml_documents(unknown, "x").at(0), "x");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.where().find("spec.mlPolicy.torch.numProcsPerNode"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ktune::v1alpha1
