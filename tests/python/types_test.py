"""ktune's dataclasses and enums have upstream's (kubeflow.trainer, the SDK installed from PyPI)
names, field order and defaults, except the deviations ktune/types.py lists; help() reads well."""
import dataclasses
import pydoc
import unittest

import sdk_test_home  # noqa: F401  (skips the module without the native module)
import ktune
import ktune.types as kt

try:
    import kubeflow.trainer.types.types as up
except ImportError:  # pragma: no cover
    up = None

SHARED = ["CustomTrainer", "TorchTuneInstructDataset", "LoraConfig", "TorchTuneConfig", "BuiltinTrainer",
          "RuntimeTrainer", "Runtime", "Step", "TrainJob", "HuggingFaceDatasetInitializer", "S3DatasetInitializer",
          "HuggingFaceModelInitializer", "S3ModelInitializer", "Initializer", "Event", "TrainJobTemplate"]
# Documented deviations (ktune/types.py): Runtime(name=...) alone is accepted; TrainJob has progress.
DEFAULTS_CHANGED = {("Runtime", "trainer"), ("Runtime", "kind"), ("RuntimeTrainer", "_RuntimeTrainer__command")}
EXTRA_FIELDS = {("TrainJob", "progress")}


def default_of(f):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return "<required>"


@unittest.skipIf(up is None, "the kubeflow SDK (pip install kubeflow) is not installed")
class MatchesUpstream(unittest.TestCase):
    def test_dataclasses_have_upstreams_fields_in_order_with_its_defaults(self):
        for name in SHARED:
            with self.subTest(name):
                ours = [f for f in dataclasses.fields(getattr(kt, name)) if (name, f.name) not in EXTRA_FIELDS]
                theirs = dataclasses.fields(getattr(up, name))
                self.assertEqual([f.name for f in ours], [f.name for f in theirs])
                for a, b in zip(ours, theirs):
                    if (name, a.name) in DEFAULTS_CHANGED:
                        continue
                    self.assertEqual(default_of(a), default_of(b), f"{name}.{a.name}")

    def test_extra_fields_come_last_with_defaults(self):
        fields = dataclasses.fields(kt.TrainJob)
        self.assertEqual(fields[-1].name, "progress")
        self.assertIsNone(fields[-1].default)

    def test_enums_have_upstreams_members_and_values(self):
        for name in ["RuntimeKind", "Loss", "DataType", "DataFormat", "TrainerType"]:
            with self.subTest(name):
                self.assertEqual([(m.name, m.value) for m in getattr(kt, name)],
                                 [(m.name, m.value) for m in getattr(up, name)])

    def test_s3_initializers_refuse_other_schemes_as_upstream(self):
        with self.assertRaisesRegex(ValueError, "must start with 's3://'"):
            kt.S3DatasetInitializer(storage_uri="hf://x/y")
        with self.assertRaisesRegex(ValueError, "must start with 's3://'"):
            kt.S3ModelInitializer(storage_uri="/tmp/x")

    def test_design_only_datasets_have_the_designs_fields(self):
        self.assertEqual([f.name for f in dataclasses.fields(kt.TorchTuneChatDataset)],
                         ["source", "split", "conversation_column", "conversation_style", "train_on_input",
                          "new_system_prompt"])
        self.assertEqual([f.name for f in dataclasses.fields(kt.TorchTuneMultimodalDataset)],
                         ["source", "split", "column_map", "image_dir", "image_tag"])


class HelpReadsWell(unittest.TestCase):
    def test_client_help_documents_every_method_and_its_errors(self):
        text = pydoc.render_doc(ktune.TrainerClient, renderer=pydoc.plaintext)
        for method in ["list_runtimes", "get_runtime", "plan", "train", "list_jobs", "get_job", "get_job_logs",
                       "wait_for_job_status", "delete_job"]:
            self.assertIn(method + "(", text)
        for word in ["ValueError", "RuntimeError", "TimeoutError", "follow=True"]:
            self.assertIn(word, text)

    def test_every_public_name_has_a_docstring(self):
        for name in ktune.__all__:
            obj = getattr(ktune, name)
            if isinstance(obj, type) or callable(obj):
                with self.subTest(name):
                    self.assertTrue((obj.__doc__ or "").strip(), name)


class NativeStub(unittest.TestCase):
    """python/ktune/_ktune.pyi is what nanobind's stubgen writes for the module as built now."""

    def test_committed_stub_matches_the_module(self):
        import os
        import re
        import subprocess
        import sys
        import tempfile
        committed = os.path.join(sdk_test_home.SOURCE_DIR, "python", "ktune", "_ktune.pyi")
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "_ktune.pyi")
            r = subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "ktune._ktune", "-o", out],
                               capture_output=True, text=True)
            if r.returncode != 0 and "No module named nanobind" in r.stderr:
                self.skipTest("nanobind is not installed")
            self.assertEqual(r.returncode, 0, r.stderr)
            fresh = re.sub(r"(?m)^build_tree_ktune_exe: str = .*$", "build_tree_ktune_exe: str", open(out).read())
        self.assertEqual(open(committed).read(), fresh,
                         "regenerate: python3 -m nanobind.stubgen -m ktune._ktune (see tests/python/types_test.py)")


if __name__ == "__main__":
    unittest.main()
