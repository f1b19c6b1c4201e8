"""Set-up shared by the Python SDK tests: the package under test, a temporary KTUNE_HOME, the test
trainer (tests/sdk/fake_tune.py, which trains nothing and stands in for `tune run`), and sources for
the real file:// initializers. Importing this module in a run without the native module raises
unittest.SkipTest, so that the runner (run_tests.py) reports the suite as skipped, never as passed.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE_DIR = os.environ.get("KTUNE_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FAKE_TUNE = os.path.join(SOURCE_DIR, "tests", "sdk", "fake_tune.py")

try:
    import ktune
    from ktune import _ktune  # noqa: F401  (the native module: the tests need it)
except ImportError as e:  # pragma: no cover
    raise unittest.SkipTest(f"ktune's native module is not importable: {e}")


# A runtime shaped as upstream's torch-distributed-with-cache: a dataset initializer (the cache's,
# whose image serves it) before torch nodes. ktune ships no such runtime; tests give it to a home or a
# fake cluster.
CACHE_RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed-with-cache", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [
        {"name": "dataset-initializer",
         "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "dataset-initializer"}},
                      "spec": {"template": {"spec": {"containers": [
                          {"name": "dataset-initializer", "image": "ghcr.io/kubeflow/trainer/dataset-initializer"}]}}}}},
        {"name": "node", "dependsOn": [{"name": "dataset-initializer", "status": "Complete"}],
         "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                      "spec": {"template": {"spec": {"containers": [
                          {"name": "node", "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"}]}}}}}]}}},
}


def ktune_exe():
    """The ktune binary the package found (installed with it, or the build tree's)."""
    exe = os.environ.get("KTUNE_EXE") or _ktune.build_tree_ktune_exe
    if not exe or not os.path.isfile(exe):
        raise unittest.SkipTest("the ktune binary is not built")
    return exe


class TempHome:
    """A KTUNE_HOME under $TMPDIR, removed (with every job in it stopped) on close."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="ktune-py-")

    def client(self, step_seconds=0.02, trainer_command=None):
        os.environ["KTUNE_FAKE_STEP_SECONDS"] = str(step_seconds)
        cmd = trainer_command or [sys.executable, FAKE_TUNE, "run"]
        return ktune.TrainerClient(ktune.BackendConfig(home=self.path, ktune_exe=ktune_exe(), trainer_command=cmd,
                                                      stop_grace_seconds=2))

    def close(self):
        try:
            c = ktune.TrainerClient(ktune.BackendConfig(home=self.path, ktune_exe=ktune_exe(), stop_grace_seconds=1))
            for job in c.list_jobs():
                c.delete_job(job.name, remove_workspace=True)
        finally:
            shutil.rmtree(self.path, ignore_errors=True)

    # A model folder and a dataset folder (JSON rows) for the file:// initializers.
    def sources(self, rows=6, dataset_text=None):
        root = os.path.join(self.path, "src")
        os.makedirs(os.path.join(root, "model", "original"), exist_ok=True)
        os.makedirs(os.path.join(root, "dataset"), exist_ok=True)
        with open(os.path.join(root, "model", "config.json"), "w") as f:
            f.write('{"model_type": "llama"}')
        with open(os.path.join(root, "model", "original", "tokenizer.model"), "w") as f:
            f.write("tokenizer")
        with open(os.path.join(root, "dataset", "train.json"), "w") as f:
            if dataset_text is not None:
                f.write(dataset_text)
            else:
                f.write("[" + ",".join('{"instruction":"say %d","input":"","output":"%d"}' % (i, i) for i in range(rows)) + "]")
        return "file://" + os.path.join(root, "model"), "file://" + os.path.join(root, "dataset")


def run_cli(args, home, env=None):
    """`ktune ARGS` (the C++ CLI over the same TrainerClient), with KTUNE_HOME=home; returns (code, out, err)."""
    e = dict(os.environ, KTUNE_HOME=home)
    e.pop("HF_TOKEN", None)
    e.update(env or {})
    p = subprocess.run([ktune_exe(), *args], capture_output=True, text=True, env=e, timeout=120)
    return p.returncode, p.stdout, p.stderr
