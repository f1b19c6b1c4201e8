"""The Python API builds the same TrainJob as the C++ API for the same call, and renders trainer
args as upstream's SDK does.

Two independent references: the C++ CLI (`ktune train --dry-run`, which fills the C++ structs from
its flags and prints TrainerClient's plan) and the upstream kubeflow SDK's own arg rendering
(kubeflow.trainer.backends.kubernetes.utils.get_args_using_torchtune_config) for the same
dataclasses. Errors: conversion and validation problems come together in one ValueError."""
import unittest

import sdk_test_home
from sdk_test_home import TempHome, run_cli
import ktune
from ktune import (BuiltinTrainer, CustomTrainer, DataFormat, DataType, HuggingFaceDatasetInitializer,
                   HuggingFaceModelInitializer, Initializer, LoraConfig, Loss, S3DatasetInitializer,
                   TorchTuneConfig, TorchTuneInstructDataset)

try:
    import kubeflow.trainer.types.types as up
    from kubeflow.trainer.backends.kubernetes.utils import get_args_using_torchtune_config
except ImportError:  # pragma: no cover
    up = None


class SameAsTheCli(unittest.TestCase):
    """`ktune train --dry-run FLAGS` and client.plan(...) with the same values print the same plan."""

    def setUp(self):
        self.home = TempHome()
        self.client = self.home.client()

    def tearDown(self):
        self.home.close()

    def check(self, flags, runtime, initializer, config):
        code, out, err = run_cli(["train", "--runtime", runtime, "--name", "same-job", "--dry-run", *flags], self.home.path)
        self.assertEqual(code, 0, err)
        plan = self.client.plan(runtime, initializer, BuiltinTrainer(config=config), name="same-job")
        self.assertEqual(str(plan), out)
        return plan

    def test_lora_job_with_model_and_dataset(self):
        plan = self.check(
            ["--model", "hf://meta-llama/Llama-3.2-1B-Instruct", "--dataset", "hf://tatsu-lab/alpaca/data",
             "--lora-rank", "8", "--lora-alpha", "16", "--epochs", "2", "--batch-size", "4", "--dtype", "fp32"],
            "torchtune-llama3.2-1b",
            Initializer(dataset=HuggingFaceDatasetInitializer(storage_uri="hf://tatsu-lab/alpaca/data"),
                        model=HuggingFaceModelInitializer(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct")),
            TorchTuneConfig(dtype=DataType.FP32, batch_size=4, epochs=2, peft_config=LoraConfig(lora_rank=8, lora_alpha=16)))
        self.assertEqual(plan.recipe, "lora_finetune_single_device")
        self.assertEqual(plan.config, "llama3_2/1B_lora_single_device")

    def test_multi_node_full_fine_tune(self):
        plan = self.check(["--num-nodes", "2", "--epochs", "1"], "torchtune-llama3.3-70b", None,
                          TorchTuneConfig(epochs=1, num_nodes=2))
        self.assertEqual(plan.num_nodes, 2)
        self.assertEqual([s["name"] for s in plan.steps][-2:], ["node-0", "node-1"])

    def test_s3_dataset_and_file_model(self):
        code, out, err = run_cli(["train", "--runtime", "torchtune-qwen2.5-0.5b", "--name", "same-job", "--dry-run",
                                  "--dataset", "s3://bucket/data", "--model", "file:///models/qwen"], self.home.path,
                                 env={"AWS_REGION": "eu-west-1"})
        self.assertEqual(code, 0, err)
        plan = self.client.plan("torchtune-qwen2.5-0.5b",
                                Initializer(dataset=S3DatasetInitializer(storage_uri="s3://bucket/data", region="eu-west-1"),
                                            model=HuggingFaceModelInitializer(storage_uri="file:///models/qwen")),
                                BuiltinTrainer(config=TorchTuneConfig()), name="same-job")
        self.assertEqual(str(plan), out)


@unittest.skipIf(up is None, "the kubeflow SDK (pip install kubeflow) is not installed")
class SameArgsAsUpstream(unittest.TestCase):
    """spec.trainer.args of our plan == upstream's get_args_using_torchtune_config for the same values."""

    def setUp(self):
        self.home = TempHome()
        self.client = self.home.client()

    def tearDown(self):
        self.home.close()

    def check(self, dataset_uri, **config):
        def build(m):
            lora = config.get("peft_config")
            ds = config.get("dataset_preprocess_config")
            return m.TorchTuneConfig(
                dtype=getattr(m.DataType, config["dtype"]) if "dtype" in config else None,
                batch_size=config.get("batch_size"), epochs=config.get("epochs"),
                loss=m.Loss.CEWithChunkedOutputLoss if config.get("loss") else None,
                peft_config=m.LoraConfig(**lora) if lora is not None else None,
                dataset_preprocess_config=m.TorchTuneInstructDataset(
                    **{**ds, "source": getattr(m.DataFormat, ds["source"]) if ds.get("source") else None})
                if ds is not None else None)

        init = lambda m: m.Initializer(dataset=m.HuggingFaceDatasetInitializer(storage_uri=dataset_uri)) if dataset_uri else None
        expected = get_args_using_torchtune_config(build(up), init(up))
        plan = self.client.plan("torchtune-llama3.2-1b", init(ktune), BuiltinTrainer(config=build(ktune)), name="args")
        self.assertEqual(plan.trainer_args, expected)
        self.assertEqual(plan.trainer_command, ["tune", "run"])

    def test_full_config(self):
        self.check("tatsu-lab/alpaca/data", dtype="BF16", batch_size=2, epochs=3, loss=True,
                   peft_config=dict(apply_lora_to_mlp=True, apply_lora_to_output=False, lora_rank=16, lora_alpha=32,
                                    lora_dropout=0.05, lora_attn_modules=["q_proj", "k_proj"]),
                   dataset_preprocess_config=dict(source="PARQUET", split="train[:10%]", train_on_input=True,
                                                  new_system_prompt="Be brief.", column_map={"input": "question", "output": "answer"}))

    def test_dataset_file_and_qlora_dora_flags(self):
        self.check("hf://org/repo/data/train.jsonl", peft_config=dict(quantize_base=True, use_dora=True, lora_rank=4),
                   dataset_preprocess_config=dict(source="JSON"))

    def test_bare_repo_and_defaults(self):
        self.check("org/repo", peft_config=dict())
        self.check(None, epochs=1)


class ErrorsBecomeValueError(unittest.TestCase):
    def setUp(self):
        self.home = TempHome()
        self.client = self.home.client()

    def tearDown(self):
        self.home.close()

    def test_every_bad_field_is_listed_in_one_error(self):
        with self.assertRaises(ValueError) as cm:
            self.client.plan("torchtune-llama3.2-1b", Initializer(model=HuggingFaceModelInitializer(storage_uri=7)),
                             BuiltinTrainer(config=TorchTuneConfig(batch_size="8", dtype="bf17",
                                                                   peft_config=LoraConfig(lora_rank=1.5))))
        where = [w for w, _ in cm.exception.errors]
        self.assertEqual(sorted(where), ["initializer.model.storage_uri", "trainer.config.batch_size",
                                         "trainer.config.dtype", "trainer.config.peft_config.lora_rank"])
        self.assertIn("4 errors", str(cm.exception))
        self.assertIn("expected one of DataType (bf16, fp32), got 'bf17'", str(cm.exception))

    def test_numbers_the_trainer_would_refuse_are_listed_before_any_job(self):
        # epochs=0 would be dropped from the args (as upstream's `if config.epochs:` drops it) and train
        # the config's default; rank 0 and dropout 2.0 the trainer refuses. All three named at plan time.
        with self.assertRaises(ValueError) as cm:
            self.client.plan("torchtune-llama3.2-1b", None,
                             BuiltinTrainer(config=TorchTuneConfig(epochs=0, peft_config=LoraConfig(lora_rank=0,
                                                                                                   lora_dropout=2.0))))
        where = [w for w, _ in cm.exception.errors]
        self.assertEqual(where, ["trainer.config.epochs", "trainer.config.peft_config.lora_rank",
                                 "trainer.config.peft_config.lora_dropout"])

    def test_control_plane_validation_lists_every_problem(self):
        trainer = CustomTrainer(func=lambda: None)
        with self.assertRaises(ValueError):  # a lambda has no source to ship
            self.client.plan("torch-distributed", None, trainer)

        def train():
            pass

        with self.assertRaises(ValueError) as cm:
            self.client.plan("torchtune-llama3.2-1b", None,
                             CustomTrainer(func=train, env={"PET_NNODES": "3"}))
        text = str(cm.exception)
        self.assertIn("spec.trainer", text)
        self.assertGreaterEqual(len(cm.exception.errors), 2, text)

    def test_unknown_runtime(self):
        with self.assertRaisesRegex(ValueError, "torchtune-nope"):
            self.client.plan("torchtune-nope", None, None)
        with self.assertRaisesRegex(RuntimeError, "torchtune-nope"):
            self.client.get_runtime("torchtune-nope")

    def test_wrong_trainer_type(self):
        with self.assertRaisesRegex(ValueError, "trainer: expected a BuiltinTrainer, a CustomTrainer or a CustomTrainerContainer"):
            self.client.plan("torchtune-llama3.2-1b", None, TorchTuneConfig())

    def test_strings_for_enums_as_the_design_writes_them(self):
        plan = self.client.plan("torchtune-llama3.2-1b", None, BuiltinTrainer(config=TorchTuneConfig(
            dtype="bf16", loss=Loss.CEWithChunkedOutputLoss,
            dataset_preprocess_config=TorchTuneInstructDataset(source="parquet"))))
        self.assertEqual(plan.trainer_args, ["dtype=bf16", "loss=torchtune.modules.loss.CEWithChunkedOutputLoss",
                                             "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet"])

    def test_yaml_hides_secrets(self):
        plan = self.client.plan("torchtune-llama3.2-1b",
                                Initializer(model=HuggingFaceModelInitializer(storage_uri="org/m", access_token="hf_SeCrEt")),
                                BuiltinTrainer(config=TorchTuneConfig()), name="secret-job")
        yaml = plan.trainjob_yaml()
        self.assertNotIn("hf_SeCrEt", yaml + str(plan) + repr(plan.steps))
        self.assertIn("name: ACCESS_TOKEN", yaml)
        self.assertIn("kind: TrainJob", yaml)
        self.assertIn("name: secret-job", yaml)


if __name__ == "__main__":
    unittest.main()
