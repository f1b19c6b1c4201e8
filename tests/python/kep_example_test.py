"""The design document's own example (KEP-2401, "Propagate torchtune Settings with SDK" and the
summary's `TrainerClient().train(...)`), run as written with two changes only: the import line
(`from ktune import ...` for `from kubeflow.trainer import ...`) and local file:// paths for the
model and the dataset (no Hugging Face Hub here). TrainerClient() takes its backend from the
environment, so KTUNE_HOME points at a temporary home.

As written, the example asks for LoRA on 5 nodes. Upstream once ran that silently as a full
fine-tune; ktune's control plane refuses it (upstream-compat.md), so the first test proves the
refusal: a ValueError naming the field, and no job started. The second runs the same call with
num_nodes=1 to completion, through the real file:// initializers and the test trainer."""
import os
import sys
import unittest

import sdk_test_home
from sdk_test_home import FAKE_TUNE, TempHome, ktune_exe

from ktune import *  # the adapted import line  # noqa: F401,F403
from ktune import (BuiltinTrainer, DataFormat, HuggingFaceDatasetInitializer, HuggingFaceModelInitializer,
                   Initializer, LoraConfig, Runtime, TorchTuneConfig, TorchTuneInstructDataset, TrainerClient)


class DesignExample(unittest.TestCase):
    def setUp(self):
        self.home = TempHome()
        self.model_uri, self.dataset_uri = self.home.sources()
        self.saved = {k: os.environ.get(k) for k in ("KTUNE_HOME", "KTUNE_EXE", "KTUNE_TRAINER_COMMAND")}
        os.environ["KTUNE_HOME"] = self.home.path
        os.environ["KTUNE_EXE"] = ktune_exe()
        os.environ["KTUNE_TRAINER_COMMAND"] = f"{sys.executable} {FAKE_TUNE} run"

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self.home.close()

    def design_call(self, num_nodes):
        model_path, dataset_path = self.model_uri, self.dataset_uri
        # ---- the design's example (KEP-2401), paths adapted -------------------------------------
        job_id = TrainerClient().train(
            runtime=Runtime(
              name="torchtune-llama3.2-1b",
            ),
            initializer=Initializer(
                dataset=HuggingFaceDatasetInitializer(
                    storage_uri=dataset_path,
                ),
                model=HuggingFaceModelInitializer(
                    storage_uri=model_path,
                    access_token="<YOUR_HF_TOKEN>",  # Replace with your Hugging Face token,
                ),
            ),
            trainer=BuiltinTrainer(
                config=TorchTuneConfig(
                    batch_size=1,
                    dataset_preprocess_config=TorchTuneInstructDataset(
                        source=DataFormat.PARQUET,
                    ),
                    dtype="bf16",
                    epochs=1,
                    num_nodes=num_nodes,
                    peft_config=LoraConfig(
                        lora_rank=64,
                        lora_alpha=128,
                    ),
                ),
            ),
        )
        # ------------------------------------------------------------------------------------------
        return job_id

    def test_as_written_lora_on_five_nodes_is_refused_before_anything_runs(self):
        with self.assertRaises(ValueError) as cm:
            self.design_call(num_nodes=5)
        self.assertEqual(cm.exception.errors, [(
            "spec.trainer.numNodes",
            "LoRA fine-tuning is not supported for multi-node training in TorchTune (numNodes 5); "
            "use 1 node with more processes")])
        self.assertEqual(TrainerClient().list_jobs(), [])

    def test_on_one_node_it_runs_to_complete(self):
        job_id = self.design_call(num_nodes=1)
        client = TrainerClient()
        job = client.wait_for_job_status(job_id, timeout=120, polling_interval=0.2)
        self.assertEqual(job.status, "Complete")
        node_log = "\n".join(client.get_job_logs(job_id))
        self.assertIn("lora_finetune_single_device with config llama3_2/1B_lora_single_device", node_log)
        self.assertNotIn("<YOUR_HF_TOKEN>", node_log + "\n".join(client.get_job_logs(job_id, step="model-initializer")))

        # ktune's exporter from the notebook: the adapter of the latest checkpoint to a folder.
        dest = os.path.join(self.home.path, "exported")
        lines = []
        summary = client.export_job(job_id, "file://" + dest, log=lines.append)
        self.assertEqual((summary["checkpoint"], summary["parts"]), ("epoch_0", "adapter"))
        self.assertEqual(sorted(f["path"] for f in summary["files"]), ["adapter_config.json", "adapter_model.safetensors"])
        self.assertEqual(sorted(os.listdir(dest)), ["adapter_config.json", "adapter_model.safetensors"])
        self.assertEqual(len(lines), 2, lines)
        with self.assertRaisesRegex(RuntimeError, "no merged model to export"):
            client.export_job(job_id, "file://" + dest + "-merged", parts="merged", log=None)
        with self.assertRaisesRegex(ValueError, "expected 'adapter', 'merged' or 'all'"):
            client.export_job(job_id, "file://" + dest, parts="everything")
        with self.assertRaisesRegex(ValueError, "gs://bucket"):
            client.export_job(job_id, "gs://bucket/model")
        with self.assertRaisesRegex(ValueError, "not a storage setting"):
            client._client.export_job(job_id, "file://" + dest, "adapter", -1, {"hf_tokn": "x"}, 10.0, None)

    def test_the_designs_defaults_only_call_plans_the_runtimes_own_job(self):
        # KEP-2401: `TrainerClient().train(runtime=client.get_runtime("torchtune-llama3.2-1b"))`,
        # planned (a dry run): running it would download Llama 3.2 1B and alpaca from the Hub.
        client = TrainerClient()
        plan = client.plan(runtime=client.get_runtime("torchtune-llama3.2-1b"))
        # No trainer: the runtime's own node command runs as the manifest writes it.
        self.assertEqual(plan.recipe, "full_finetune_distributed")
        self.assertEqual(plan.config, "llama3_2/1B_full")
        self.assertEqual([s["name"] for s in plan.steps], ["dataset-initializer", "model-initializer", "node-0"])


if __name__ == "__main__":
    unittest.main()
