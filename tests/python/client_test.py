"""TrainerClient from Python against the local backend, for real: the real file:// initializers (the
ktune binary), the TEST TRAINER tests/sdk/fake_tune.py for `tune run` (it trains nothing; it prints
torchtune-style loss lines and reports progress), and torchrun for a CustomTrainer's function.
Each test uses its own KTUNE_HOME and stops and removes every job it started."""
import json
import os
import shutil
import sys
import unittest

import ktune
import sdk_test_home
from sdk_test_home import TempHome
from ktune import (BuiltinTrainer, CustomTrainer, HuggingFaceDatasetInitializer, HuggingFaceModelInitializer,
                   Initializer, TorchTuneConfig)

RUNTIME = "torchtune-llama3.2-1b"


def _reads_the_cache():
    print("would read the data cache")


class LocalBackend(unittest.TestCase):
    def setUp(self):
        self.home = TempHome()

    def tearDown(self):
        self.home.close()

    def start(self, client, rows=6, batch_size=2, epochs=2, name=None, dataset_text=None):
        model, dataset = self.home.sources(rows=rows, dataset_text=dataset_text)
        return client.train(RUNTIME,
                            Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri=dataset),
                                        model=HuggingFaceModelInitializer(storage_uri=model)),
                            BuiltinTrainer(config=TorchTuneConfig(batch_size=batch_size, epochs=epochs)), name=name)

    def test_train_follow_wait_get_list_delete(self):
        client = self.home.client()
        job = self.start(client)
        self.assertRegex(job, r"^[a-z][0-9a-f]{11}$")
        lines = list(client.get_job_logs(job, follow=True))
        self.assertEqual(len([l for l in lines if "|Loss: " in l]), 6, lines)  # 6 rows / batch 2 x 2 epochs
        done = client.wait_for_job_status(job, timeout=60, polling_interval=0.2)
        self.assertEqual(done.status, "Complete")
        self.assertEqual([(s.name, s.status) for s in done.steps],
                         [("dataset-initializer", "Complete"), ("model-initializer", "Complete"), ("node-0", "Complete")])
        self.assertEqual(done.progress.progress_percentage, 100)
        self.assertAlmostEqual(done.progress.metrics["loss"], 2.5 * 0.9 ** 6, places=3)
        self.assertIsNotNone(done.creation_timestamp.tzinfo)
        self.assertEqual(done.runtime.name, RUNTIME)
        self.assertEqual(list(client.get_job_logs(job)), lines)  # the whole log, without follow
        self.assertIn("file://", "\n".join(client.get_job_logs(job, step="model-initializer")))
        self.assertEqual([j.name for j in client.list_jobs()], [job])
        self.assertEqual([j.name for j in client.list_jobs(client.get_runtime(RUNTIME))], [job])
        self.assertEqual(client.list_jobs(client.get_runtime("torchtune-qwen2.5-0.5b")), [])
        run = json.load(open(os.path.join(self.home.path, "jobs", job, "output", "fake_tune_run.json")))
        self.assertEqual(run["recipe"], "full_finetune_single_device")
        self.assertEqual(run["overrides"]["batch_size"], "2")
        client.delete_job(job, remove_workspace=True)
        with self.assertRaisesRegex(RuntimeError, job):
            client.get_job(job)
        self.assertFalse(os.path.exists(os.path.join(self.home.path, "jobs", job)))

    def test_follow_streams_lines_while_the_step_runs(self):
        client = self.home.client(step_seconds=1.0)
        job = self.start(client, rows=8, batch_size=1, epochs=1)  # 8 steps of 1 s
        logs = client.get_job_logs(job, follow=True)
        for line in logs:
            if "|Loss: " in line:
                break
        # The first loss line came while the trainer still had 7 s of steps to go.
        self.assertEqual(client.get_job(job).status, "Running")
        logs.close()  # stops the reader at its next line
        client.delete_job(job)

    def test_wait_times_out(self):
        client = self.home.client(step_seconds=1.0)
        job = self.start(client, rows=30, batch_size=1, epochs=1)
        with self.assertRaisesRegex(TimeoutError, f"Timeout waiting for TrainJob {job} to reach status: {{'Complete'}}"):
            client.wait_for_job_status(job, timeout=1, polling_interval=0.2)
        seen = []
        running = client.wait_for_job_status(job, status={"Running"}, timeout=60, polling_interval=0.1,
                                             callbacks=[lambda j: seen.append(j.status)])
        self.assertEqual(running.status, "Running")
        self.assertEqual(seen[-1], "Running")

    def test_a_failed_job_raises_runtime_error(self):
        client = self.home.client()
        job = self.start(client, dataset_text="not json", name="failing-job")
        self.assertEqual(job, "failing-job")
        with self.assertRaisesRegex(RuntimeError, "TrainJob failing-job is Failed"):
            client.wait_for_job_status(job, timeout=60, polling_interval=0.1)
        self.assertEqual(client.wait_for_job_status(job, status={"Failed"}, timeout=5, polling_interval=0.1).status, "Failed")

    def test_wait_arguments_are_checked_as_upstream(self):
        client = self.home.client()
        job = self.start(client)
        with self.assertRaisesRegex(ValueError, "must be a subset of"):
            client.wait_for_job_status(job, status={"Done"})
        with self.assertRaisesRegex(ValueError, "Polling interval must be strictly less than timeout"):
            client.wait_for_job_status(job, timeout=1, polling_interval=2)
        with self.assertRaisesRegex(ValueError, "Timeout must be a positive number, got timeout=0"):
            client.wait_for_job_status(job, status={"Done"}, timeout=0)  # upstream's order: the times first
        with self.assertRaisesRegex(RuntimeError, "no-such-job"):
            client.wait_for_job_status("no-such-job", timeout=5, polling_interval=1)
        with self.assertRaisesRegex(RuntimeError, "no-such-job"):
            list(client.get_job_logs("no-such-job", follow=True))
        with self.assertRaisesRegex(RuntimeError, "no step 'node-7'"):
            list(client.get_job_logs(job, step="node-7"))

    def test_waiting_and_following_let_other_python_threads_run(self):
        import threading
        client = self.home.client(step_seconds=0.3)
        job = self.start(client, rows=6, batch_size=1, epochs=1)  # about 2 s of steps
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(1)
                stop.wait(0.01)

        t = threading.Thread(target=tick)
        t.start()
        try:
            before = len(ticks)
            lines = list(client.get_job_logs(job, follow=True))
            during_follow = len(ticks) - before
            self.assertEqual(client.wait_for_job_status(job, timeout=60, polling_interval=0.5).status, "Complete")
        finally:
            stop.set()
            t.join()
        self.assertTrue(any("|Loss: " in l for l in lines))
        self.assertGreater(during_follow, 10)   # the follow took seconds; the other thread kept running

    def test_a_callback_error_stops_the_wait(self):
        client = self.home.client()
        job = self.start(client)

        def boom(j):
            raise KeyError("from the callback")

        with self.assertRaisesRegex(KeyError, "from the callback"):
            client.wait_for_job_status(job, timeout=60, polling_interval=0.1, callbacks=[boom])

    @unittest.skipIf(shutil.which("torchrun") is None, "torchrun (torch) is not installed")
    def test_custom_trainer_function_runs_with_the_torchrun_env(self):
        out = os.path.join(self.home.path, "custom.json")

        def train_func(out, lr):
            import json
            import os
            keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK"]
            with open(out, "w") as f:
                json.dump({"lr": lr, "env": {k: os.environ.get(k) for k in keys}}, f)
            print("trained with lr", lr)

        client = self.home.client()
        job = client.train(trainer=CustomTrainer(func=train_func, func_args={"out": out, "lr": 0.01},
                                                 env={"KTUNE_TEST_VAR": "1"}))
        done = client.wait_for_job_status(job, timeout=120, polling_interval=0.2)
        self.assertEqual(done.status, "Complete", "\n".join(client.get_job_logs(job)))
        self.assertEqual(done.runtime.name, "torch-distributed")
        got = json.load(open(out))
        self.assertEqual(got["lr"], 0.01)
        self.assertEqual(got["env"]["RANK"], "0")
        self.assertEqual(got["env"]["WORLD_SIZE"], "1")
        self.assertEqual(got["env"]["PET_NNODES"], "1")
        self.assertEqual(got["env"]["MASTER_ADDR"], "127.0.0.1")
        self.assertIn("trained with lr 0.01", "\n".join(client.get_job_logs(job)))

    def test_a_trainjob_template_is_the_train_calls_arguments(self):
        client = self.home.client()
        template = ktune.TrainJobTemplate(trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1)), runtime=RUNTIME)
        self.assertEqual(dict(template), {"trainer": template.trainer, "runtime": RUNTIME, "initializer": None})
        by_template = client.plan(**template)
        by_call = client.plan(runtime=RUNTIME, trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1)))
        self.assertEqual(by_template.trainjob_yaml().replace(by_template.job_name, "N"),
                         by_call.trainjob_yaml().replace(by_call.job_name, "N"))
        job = client.train(**template)
        self.assertEqual(client.get_job(job).runtime.name, RUNTIME)

    def test_options_as_upstream_name_everywhere_metadata_on_kubernetes_only(self):
        from ktune.options import ActiveDeadlineSeconds, Annotations, Labels, Name
        client = self.home.client()
        job = client.train(RUNTIME, trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1)), options=[Name("named-job")])
        self.assertEqual(job, "named-job")
        try:  # upstream's own option objects are read by class name and fields
            from kubeflow.trainer.options import Name as UpstreamName
            from kubeflow.trainer.options import RuntimePatch
            self.assertEqual(client.plan(RUNTIME, options=[UpstreamName(name="upstream-named")]).job_name, "upstream-named")
            with self.assertRaisesRegex(ValueError, "RuntimePatch is not supported by ktune"):
                client.plan(RUNTIME, options=[RuntimePatch()])
        except ImportError:
            pass
        meta = [Labels({"team": "nlp", "example.com/tier": "gold"}), Annotations({"note": "any text: here"}),
                ActiveDeadlineSeconds(3600)]
        yaml_text = client.plan(RUNTIME, options=meta).trainjob_yaml()  # rendered whatever the backend
        for text in ("team: nlp", "example.com/tier: gold", 'note: "any text: here"', "activeDeadlineSeconds: 3600"):
            self.assertIn(text, yaml_text)
        for option in meta:  # the local backend refuses each at train(), as upstream's options do
            with self.assertRaisesRegex(ValueError, type(option).__name__ + " option is not compatible with the local backend"):
                client.train(RUNTIME, options=[option])
        with self.assertRaises(ValueError) as bad:
            client.plan(RUNTIME, options=[Labels({"-bad": "x", "ok": "a b"})])
        self.assertEqual(sorted(f for f, _ in bad.exception.errors), ["metadata.labels[-bad]", "metadata.labels[ok]"])
        with self.assertRaisesRegex(ValueError, "disagree"):
            client.plan(RUNTIME, options=[Name("a-job")], name="b-job")
        with self.assertRaisesRegex(ValueError, "positive integer"):
            ActiveDeadlineSeconds(0)
        self.assertEqual(client.list_jobs()[0].name, "named-job")

    def test_default_runtime_and_pip_indexes_come_from_the_environment_as_upstreams(self):
        import subprocess
        code = ("import ktune; print(ktune.constants.DEFAULT_TRAINING_RUNTIME); "
                "print(ktune.CustomTrainer(func=print).pip_index_urls)")
        env = dict(os.environ, DEFAULT_TRAINING_RUNTIME="my-torch",
                   DEFAULT_PIP_INDEX_URLS="https://mirror.example/simple,https://extra.example/simple")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        self.assertEqual(out.splitlines(), ["my-torch", "['https://mirror.example/simple', 'https://extra.example/simple']"])
        env.pop("DEFAULT_TRAINING_RUNTIME"), env.pop("DEFAULT_PIP_INDEX_URLS")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
        self.assertEqual(out.splitlines(), ["torch-distributed", "['https://pypi.org/simple']"])

    def test_events_and_runtime_packages(self):
        client = self.home.client()
        with self.assertRaisesRegex(NotImplementedError, "the local backend has no cluster events"):
            client.get_job_events("any")
        with self.assertRaisesRegex(ValueError, "Cannot get Runtime packages for BuiltinTrainer"):
            client.get_runtime_packages(client.get_runtime(RUNTIME))
        with self.assertRaises(TypeError):  # keyword-only, as upstream's pydantic model
            ktune.KubernetesBackendConfig("ns")
        # Upstream's backend configs under their names from ktune too ("change only the import").
        from ktune.client import _backend_config
        self.assertEqual(_backend_config(ktune.LocalProcessBackendConfig(cleanup_venv=False)).kind, ktune.BackendKind.LOCAL)
        container = ktune.ContainerBackendConfig(container_runtime="docker",
                                                 runtime_source=ktune.TrainingRuntimeSource(sources=["file:///rt"]))
        with self.assertWarnsRegex(UserWarning, "ContainerBackendConfig: ktune runs the job's steps as processes"):
            self.assertEqual(_backend_config(container).kind, ktune.BackendKind.LOCAL)
        self.assertEqual((container.pull_policy, container.initializer_timeout), ("IfNotPresent", 600))
        try:  # upstream's own backend configs
            from kubeflow.common.types import KubernetesBackendConfig as UpstreamKubernetes
            from kubeflow.trainer.backends.localprocess.types import LocalProcessBackendConfig
            from kubeflow.trainer.backends.container.types import ContainerBackendConfig
        except ImportError:
            return
        from ktune.client import _backend_config
        c = _backend_config(UpstreamKubernetes(namespace="team-a", config_file="/kc", context="ctx"))
        self.assertEqual((c.kind, c.namespace, c.config_file, c.context),
                         (ktune.BackendKind.KUBERNETES, "team-a", "/kc", "ctx"))
        self.assertEqual(_backend_config(LocalProcessBackendConfig()).kind, ktune.BackendKind.LOCAL)
        # Upstream's container backend: the same steps as local processes, said in a warning.
        with self.assertWarnsRegex(UserWarning, "ContainerBackendConfig: ktune runs the job's steps as processes"):
            self.assertEqual(_backend_config(ContainerBackendConfig(container_runtime="podman")).kind,
                             ktune.BackendKind.LOCAL)

        class SomethingElse:
            pass
        with self.assertRaisesRegex(ValueError, "SomethingElse is not a backend ktune has"):
            _backend_config(SomethingElse())

    def test_a_container_trainer_and_its_command_options_need_a_cluster(self):
        from ktune.options import TrainerArgs, TrainerCommand
        client = self.home.client()
        container = ktune.CustomTrainerContainer(image="registry.example.com/train:1", num_nodes=2, env={"A": "1"})
        plan = client.plan("torch-distributed", trainer=container, options=[TrainerCommand(["python", "train.py"])])
        self.assertIn("image: registry.example.com/train:1", plan.trainjob_yaml())  # rendered whatever the backend

        class Boxed(ktune.CustomTrainerContainer):  # a user's subclasses count as their classes
            pass

        class Command(TrainerCommand):
            pass

        boxed = client.plan("torch-distributed", trainer=Boxed(image="registry.example.com/train:2"),
                            options=[Command(["python", "x.py"])]).trainjob_yaml()
        self.assertIn("image: registry.example.com/train:2", boxed)
        self.assertIn("x.py", boxed)
        with self.assertRaisesRegex(ValueError, "CustomTrainerContainer runs a container image, which the local backend cannot"):
            client.train("torch-distributed", trainer=container)
        with self.assertRaisesRegex(ValueError, "TrainerArgs option is not compatible with the local backend"):
            client.train("torch-distributed", options=[TrainerArgs(["--x"])])
        with self.assertRaisesRegex(ValueError, "TrainerCommand can only be used with CustomTrainerContainer"):
            client.plan(RUNTIME, trainer=BuiltinTrainer(config=TorchTuneConfig()), options=[TrainerCommand(["x"])])
        with self.assertRaisesRegex(ValueError, "TrainerArgs.args must be a list of strings"):
            client.plan("torch-distributed", trainer=container, options=[TrainerArgs("--x")])
        with self.assertRaisesRegex(ValueError, "CustomTrainer can't be used with runtime " + RUNTIME):
            client.plan(RUNTIME, trainer=container)
        with self.assertRaisesRegex(ValueError, r"trainer\.image: must name the container image"):
            client.plan("torch-distributed", trainer=ktune.CustomTrainerContainer(image=""))
        # A data cache, on a runtime whose dataset initializer serves it (in this home's runtimes).
        os.makedirs(os.path.join(self.home.path, "runtimes"), exist_ok=True)
        with open(os.path.join(self.home.path, "runtimes", "cache.yaml"), "w") as f:
            json.dump(sdk_test_home.CACHE_RUNTIME, f)
        client = self.home.client()
        cache = ktune.Initializer(dataset=ktune.DataCacheInitializer(storage_uri="cache://sales/orders",
                                                                     metadata_loc="s3://lake/m.json", num_data_nodes=2))
        runtime = "torch-distributed-with-cache"
        self.assertIn("cache://sales/orders", client.plan(runtime, cache, container).trainjob_yaml())
        with self.assertRaisesRegex(ValueError, "DataCacheInitializer needs the data cache's nodes"):
            client.train(runtime, cache, CustomTrainer(func=_reads_the_cache))
        with self.assertRaisesRegex(ValueError, "num_data_nodes must be greater than 1"):
            ktune.DataCacheInitializer(storage_uri="cache://a/b", metadata_loc="m", num_data_nodes=1)
        self.assertEqual(client.list_jobs(), [])

    @unittest.skipIf(shutil.which("torchrun") is None, "torchrun (torch) is not installed")
    def test_runtime_packages_of_the_torch_runtime_are_printed_and_the_job_removed(self):
        import contextlib
        import io
        client = self.home.client()
        out = io.StringIO()
        trainers, train = [], client.train

        def spy(**kwargs):
            trainers.append(kwargs["trainer"])
            return train(**kwargs)
        client.train = spy
        with contextlib.redirect_stdout(out):
            client.get_runtime_packages("torch-distributed")
        self.assertIn("Python: " + sys.version.split()[0], out.getvalue())
        # As upstream: one node with one CPU for a runtime without GPUs, not the runtime's own request.
        self.assertEqual((trainers[0].num_nodes, trainers[0].resources_per_node), (1, {"cpu": 1}))
        self.assertEqual(client.list_jobs(), [])
        self.assertEqual(os.listdir(os.path.join(self.home.path, "jobs")), [])


if __name__ == "__main__":
    unittest.main()
