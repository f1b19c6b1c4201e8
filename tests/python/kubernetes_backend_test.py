"""BackendConfig's Kubernetes kind reaches the C++ Kubernetes backend with the kubeconfig, context and
namespace given from Python: a fake API server (http, on loopback) sees the requests, and the TrainJob
that train() POSTs is the one plan() renders for the same call, which is also the one the C++ CLI's
`ktune train --backend kubernetes --dry-run` prints for the same values."""
import http.server
import json
import os
import threading
import unittest

import sdk_test_home
from sdk_test_home import TempHome, run_cli
import yaml
from ktune import (BuiltinTrainer, DataType, HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, Initializer,
                   KubernetesBackendConfig, LoraConfig, TorchTuneConfig, TrainerClient)

KUBECONFIG = """apiVersion: v1
kind: Config
current-context: ctx-a
clusters:
- name: fake
  cluster: {{server: "http://127.0.0.1:{port}"}}
users:
- name: me
  user: {{token: t0ken-for-tests}}
contexts:
- name: ctx-a
  context: {{cluster: fake, user: me, namespace: team-a}}
- name: ctx-b
  context: {{cluster: fake, user: me, namespace: team-b}}
"""


def _ktune_runtimes():
    """ktune's runtimes, as `kubectl apply -k manifests/` installs them on a cluster."""
    import glob
    runtimes = []
    for path in sorted(glob.glob(os.path.join(sdk_test_home.SOURCE_DIR, "manifests", "runtimes", "**", "*.yaml"),
                                 recursive=True)):
        with open(path) as f:
            runtimes += [d for d in yaml.safe_load_all(f) if d and d.get("kind") == "ClusterTrainingRuntime"]
    return runtimes


class FakeApiServer(http.server.BaseHTTPRequestHandler):
    requests = []
    runtimes = _ktune_runtimes() + [sdk_test_home.CACHE_RUNTIME]  # the cluster's

    def log_message(self, *args):
        pass

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        FakeApiServer.requests.append(("GET", self.path, self.headers.get("Authorization"), None))
        if self.path.endswith("/trainjobs"):
            return self.answer(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJobList", "items": []})
        if self.path.endswith("/clustertrainingruntimes"):
            return self.answer(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "items": FakeApiServer.runtimes})
        if self.path.endswith("trainingruntimes"):
            return self.answer(200, {"apiVersion": "trainer.kubeflow.org/v1alpha1", "items": []})
        return self.answer(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "message": "not found", "code": 404})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeApiServer.requests.append(("POST", self.path, self.headers.get("Authorization"), body))
        body.setdefault("metadata", {}).setdefault("uid", "1234")
        return self.answer(201, body)


class KubernetesBackend(unittest.TestCase):
    def setUp(self):
        self.home = TempHome()
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeApiServer)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        FakeApiServer.requests = []
        self.kubeconfig = os.path.join(self.home.path, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(KUBECONFIG.format(port=self.server.server_address[1]))

    def tearDown(self):
        self.server.shutdown()
        self.server.server_close()
        self.home.close()

    def test_context_and_namespace_reach_the_api_server(self):
        client = TrainerClient(KubernetesBackendConfig(config_file=self.kubeconfig, context="ctx-b"))
        self.assertEqual(client.backend, "kubernetes")
        self.assertEqual(client.list_jobs(), [])
        client = TrainerClient(KubernetesBackendConfig(config_file=self.kubeconfig, namespace="ns-x"))
        self.assertEqual(client.list_jobs(), [])
        paths = [(m, p) for m, p, _, _ in FakeApiServer.requests if p.endswith("/trainjobs")]
        self.assertEqual(paths, [("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-b/trainjobs"),
                                 ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns-x/trainjobs")])
        self.assertTrue(all(auth == "Bearer t0ken-for-tests" for _, _, auth, _ in FakeApiServer.requests))
        with self.assertRaisesRegex(RuntimeError, "404|not found|NotFound"):
            client.get_job("nope")

    def test_train_posts_the_trainjob_plan_renders(self):
        client = TrainerClient(KubernetesBackendConfig(config_file=self.kubeconfig))
        args = dict(runtime="torchtune-llama3.2-1b",
                    initializer=Initializer(model=HuggingFaceModelInitializer(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct")),
                    trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1, peft_config=LoraConfig(lora_rank=8))))
        rendered = yaml.safe_load(client.plan(**args, name="k8s-job").trainjob_yaml())
        self.assertEqual(client.train(**args, name="k8s-job"), "k8s-job")
        posts = [r for r in FakeApiServer.requests if r[0] == "POST" and r[1].endswith("/trainjobs")]
        self.assertEqual(len(posts), 1, FakeApiServer.requests)
        self.assertEqual(posts[0][1], "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs")
        sent = posts[0][3]
        self.assertEqual(sent["kind"], "TrainJob")
        self.assertEqual(sent["metadata"]["name"], "k8s-job")
        self.assertEqual(sent["spec"]["runtimeRef"], rendered["spec"]["runtimeRef"])
        self.assertEqual(sent["spec"]["trainer"], rendered["spec"]["trainer"])
        self.assertEqual(sent["spec"]["initializer"], rendered["spec"]["initializer"])

    def test_a_container_trainer_posts_upstreams_trainer(self):
        from ktune import CustomTrainerContainer
        from ktune.options import TrainerArgs, TrainerCommand
        client = TrainerClient(KubernetesBackendConfig(config_file=self.kubeconfig))
        fields = dict(image="registry.example.com/team/train:3", num_nodes=2,
                      resources_per_node={"gpu": 1, "memory": "8Gi"}, env={"EPOCHS": "3"})
        command, args = ["python", "train.py"], ["--epochs", "3"]
        self.assertEqual(client.train("torch-distributed", trainer=CustomTrainerContainer(**fields),
                                      options=[TrainerCommand(command), TrainerArgs(args)], name="boxed"), "boxed")
        sent = [r for r in FakeApiServer.requests if r[0] == "POST" and r[1].endswith("/trainjobs")][0][3]
        trainer = sent["spec"]["trainer"]
        self.assertEqual(trainer["image"], fields["image"])
        self.assertEqual(trainer["numNodes"], 2)
        self.assertEqual(trainer["env"], [{"name": "EPOCHS", "value": "3"}])
        self.assertEqual((trainer["command"], trainer["args"]), (command, args))
        try:  # the same call through upstream's SDK renders the same trainer
            from kubeflow.trainer.backends.kubernetes.backend import KubernetesBackend as Upstream
            from kubeflow.trainer.types import types as up
        except ImportError:
            return
        runtime = up.Runtime(name="torch-distributed", kind=up.RuntimeKind.CLUSTER_TRAINING_RUNTIME,
                             trainer=up.RuntimeTrainer(trainer_type=up.TrainerType.CUSTOM_TRAINER, framework="torch",
                                                       image="unused"))
        spec = object.__new__(Upstream)._get_trainjob_spec(runtime=runtime, trainer=up.CustomTrainerContainer(**fields),
                                                           trainer_overrides={"command": command, "args": args}).to_dict()
        theirs = spec["trainer"]
        for key in ("image", "numNodes", "env", "command", "args"):
            self.assertEqual(trainer[key], theirs[key], key)
        for side in ("limits", "requests"):  # quantities: upstream's model writes 1.0 where ktune writes "1"
            self.assertEqual({k: str(v).removesuffix(".0") for k, v in theirs["resourcesPerNode"][side].items()},
                             {k: str(v) for k, v in trainer["resourcesPerNode"][side].items()})
        # A data cache dataset: the dataset initializer upstream renders for it.
        from ktune import DataCacheInitializer, Initializer as KInitializer
        cache = dict(storage_uri="cache://sales/orders", metadata_loc="s3://lake/m.json", num_data_nodes=3,
                     worker_mem="8Gi", iam_role="arn:aws:iam::1:role/r")
        ours = yaml.safe_load(client.plan("torch-distributed-with-cache", KInitializer(dataset=DataCacheInitializer(**cache)),
                                          CustomTrainerContainer(**fields)).trainjob_yaml())["spec"]["initializer"]
        from kubeflow.trainer.backends.kubernetes import utils as upstream_utils
        theirs = upstream_utils.get_dataset_initializer(up.DataCacheInitializer(**cache)).to_dict()
        self.assertEqual(ours["dataset"], theirs)
        # And upstream's own objects are taken as they are.
        from kubeflow.trainer.options import TrainerCommand as UpstreamCommand
        rendered = yaml.safe_load(client.plan("torch-distributed", trainer=up.CustomTrainerContainer(**fields),
                                              options=[UpstreamCommand(command=command)]).trainjob_yaml())
        self.assertEqual((rendered["spec"]["trainer"]["image"], rendered["spec"]["trainer"]["command"]), (fields["image"], command))

    def test_plan_yaml_is_the_clis_kubernetes_dry_run(self):
        # `ktune train --backend kubernetes --dry-run` (C++ flags -> structs) prints the TrainJob it would create.
        code, out, err = run_cli(["train", "--backend", "kubernetes", "--runtime", "torchtune-qwen2.5-0.5b", "--name", "cli-job",
                                  "--dry-run", "--model", "hf://Qwen/Qwen2.5-0.5B-Instruct", "--dataset", "hf://org/data/train",
                                  "--lora-rank", "8", "--lora-alpha", "16", "--epochs", "3", "--batch-size", "2",
                                  "--dtype", "bf16"], self.home.path, env={"KUBECONFIG": self.kubeconfig})
        self.assertEqual(code, 0, err)
        client = TrainerClient(KubernetesBackendConfig(config_file=self.kubeconfig))
        plan = client.plan("torchtune-qwen2.5-0.5b",
                           Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="hf://org/data/train"),
                                       model=HuggingFaceModelInitializer(storage_uri="hf://Qwen/Qwen2.5-0.5B-Instruct")),
                           BuiltinTrainer(config=TorchTuneConfig(dtype=DataType.BF16, batch_size=2, epochs=3,
                                                                 peft_config=LoraConfig(lora_rank=8, lora_alpha=16))),
                           name="cli-job")
        cli, ours = yaml.safe_load(out), yaml.safe_load(plan.trainjob_yaml())
        self.assertEqual(cli["metadata"].pop("namespace"), "team-a")  # the backend adds its namespace
        self.assertEqual(cli, ours)


if __name__ == "__main__":
    unittest.main()
