#!/usr/bin/env python3
"""train_step_compare.py's own logic, without a GPU: which ktune runs it makes, its fallbacks and its
summary, against a fake ktune_gpu_train_step_bench (a script that answers as the binary does).

The script runs first on a lent GPU, whose minutes are few: a mistake in which rows it runs or how it
reads them must show here, not there. The PyTorch side needs a GPU and is not run (the fake has none to
compare with, so each torch part reports itself failed, as it would on a machine without CUDA); what is
checked is ktune's side: the attention kernels asked for (auto by default), the extra LoRA row on the
GEMM path only when auto chose another kernel, the rerun on the tiled kernel when a run fails, the
summary's ktune fields and the exit codes.
"""
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
COMPARE = os.path.join(HERE, "train_step_compare.py")

# Answers as ktune_gpu_train_step_bench does: the trials' line under --attention=auto (choosing
# $FAKE_AUTO_CHOICE), then one RESULT line; exit 1 for an attention kernel named in $FAKE_FAILING,
# 77 with $FAKE_NO_GPU. Every call's arguments are appended to $FAKE_LOG.
FAKE_BENCH = r'''#!/usr/bin/env python3
import os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\n")
if os.environ.get("FAKE_NO_GPU"):
    print("SKIP train_step_bench: no CUDA device")
    sys.exit(77)
asked = args.get("attention", "auto")
if asked in os.environ.get("FAKE_FAILING", "").split(","):
    print("ERROR cuda: an illegal memory access", file=sys.stderr)
    sys.exit(1)
ran = asked
if asked == "auto":
    ran = os.environ.get("FAKE_AUTO_CHOICE", "tensor_core")
    print("attention kernels timed (forward + backward of one layer): gemm 6.000 ms (agrees to 5.0e-03), "
          "tensor_core 1.500 ms (agrees to 5.0e-03), flash 40.000 ms (agrees to 5.0e-03); chose " + ran)
tps = {"tensor_core": 90000, "gemm": 50000, "flash": 20000}[ran]
print(f"RESULT side=ktune model=1b mode={args['mode']} activation_checkpointing=0 activation_offloading=0 "
      f"attention={ran} batch={args['batch']} seq={args['seq']} steps=2 step_ms=91.0 tokens_per_s={tps} "
      f"flops_per_token=5.6e9 tflops=504.0 mfu=0.509 loss_first=12.1 loss_last=11.9 planned_gib=7.85 "
      f"device_used_gib=8.20 run_used_gib=7.90 attention_ms=12.0 loss_ms=5.0 fwd_bwd_ms=88.0 gemm_calls=900 "
      f"backward_host_ms=20.0 backward_device_ms=60.0 gemm_call_us=3.1 kernel_launch_us=2.2 gemm_host_ms=2.8")
'''


class TrainStepCompareTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.bench = os.path.join(self.dir.name, "ktune_gpu_train_step_bench")
        with open(self.bench, "w") as f:
            f.write(FAKE_BENCH)
        os.chmod(self.bench, 0o755)
        self.log = os.path.join(self.dir.name, "calls.log")

    def tearDown(self):
        self.dir.cleanup()

    def compare(self, *extra, **env):
        run_env = dict(os.environ, FAKE_LOG=self.log, **env)
        # the PyTorch side must not find a GPU even where there is one: this tests the script alone
        run_env["CUDA_VISIBLE_DEVICES"] = ""
        p = subprocess.run([sys.executable, COMPARE, self.bench, "--steps=2", "--warmup=1", "--timeout=120", *extra],
                           capture_output=True, text=True, env=run_env, timeout=600)
        calls = []
        if os.path.exists(self.log):
            with open(self.log) as f:
                calls = f.read().splitlines()
        return p.returncode, p.stdout + p.stderr, calls

    def test_auto_is_the_default_and_the_lora_step_runs_again_on_the_gemm_path(self):
        rc, out, calls = self.compare("--modes=lora,full", "--also-attention=gemm")
        self.assertEqual(len([c for c in calls if "--attention=auto" in c and "--mode=lora" in c]), 1, calls)
        self.assertEqual(len([c for c in calls if "--attention=auto" in c and "--mode=full" in c]), 1, calls)
        self.assertEqual(len([c for c in calls if "--attention=gemm" in c and "--mode=lora" in c]), 1, calls)
        self.assertEqual(len(calls), 3, calls)
        self.assertIn("    attention kernels timed (forward + backward of one layer)", out)  # what gpu-check greps
        self.assertIn("lora  ktune-gemm", out)
        self.assertIn("SUMMARY mode=lora ktune_attention=tensor_core ktune_tokens_per_s=90000 ktune_mfu=50.9%", out)
        self.assertIn("ktune_attention_share=14%", out)
        self.assertIn("SUMMARY mode=full ktune_attention=tensor_core", out)
        self.assertIn("torch=FAILED", out)  # no GPU for PyTorch here
        self.assertEqual(rc, 1, out)

    def test_no_extra_row_when_auto_chose_the_gemm_path(self):
        rc, out, calls = self.compare("--modes=lora", "--also-attention=gemm", FAKE_AUTO_CHOICE="gemm")
        self.assertEqual(len(calls), 1, calls)
        self.assertIn("--attention=auto", calls[0])
        self.assertNotIn("ktune-gemm", out)
        self.assertIn("SUMMARY mode=lora ktune_attention=gemm ktune_tokens_per_s=50000", out)

    def test_a_failing_run_is_run_again_on_the_tiled_kernel_and_reported(self):
        rc, out, calls = self.compare("--modes=lora", FAKE_FAILING="auto")
        self.assertEqual(len(calls), 2, calls)
        self.assertIn("--attention=flash", calls[1])
        self.assertIn("SUMMARY mode=lora ktune_attention=flash ktune_tokens_per_s=20000", out)
        self.assertIn("FAILED parts: ktune lora with auto attention (exit 1)", out)
        self.assertEqual(rc, 1, out)

    def test_a_named_kernel_is_passed_through(self):
        rc, out, calls = self.compare("--modes=lora", "--attention=gemm", "--also-attention=gemm")
        self.assertEqual(len(calls), 1, calls)
        self.assertIn("--attention=gemm", calls[0])
        self.assertIn("SUMMARY mode=lora ktune_attention=gemm", out)

    def test_no_gpu_is_exit_77(self):
        rc, out, calls = self.compare("--modes=lora", FAKE_NO_GPU="1")
        self.assertEqual(rc, 77, out)
        self.assertIn("SKIP gpu train-step benchmark: no CUDA device", out)


if __name__ == "__main__":
    unittest.main()
