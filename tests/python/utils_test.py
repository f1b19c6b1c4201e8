"""ktune.update_trainjob_status and ktune.get_tpu_num_nodes, upstream's helpers from
``kubeflow.trainer``: the status update over TLS with the projected token to Kubeflow Trainer's status
server (tests/sdk/kube_api_server.py plays it, validating as the controller does), written into the
TrainJob's status; throttled, and False (never an exception) wherever it cannot report. Where
upstream's SDK is installed, its own update_trainjob_status is sent to the same server, so the fake's
checks are known to take what upstream sends, and the two helpers agree on TPU hosts.
"""
import json
import logging
import os
import subprocess
import tempfile
import unittest
import urllib.request
from unittest import mock

import sdk_test_home  # noqa: F401  (skips the suite without the native module)
import ktune
from ktune import utils

SERVER = os.path.join(sdk_test_home.SOURCE_DIR, "tests", "sdk", "kube_api_server.py")
STATUS_TOKEN = "status-token-for-python-tests"


def has_cryptography():
    try:
        import cryptography  # noqa: F401
        return True
    except ImportError:
        return False


@unittest.skipUnless(has_cryptography(), "python3 cryptography (the test PKI) is not installed")
class UpdateTrainJobStatus(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        pki = os.path.join(self.dir.name, "pki")
        self.server = subprocess.Popen(["python3", SERVER, "--token", "api-token", "--status-token", STATUS_TOKEN,
                                        "--tls-dir", pki, "--max-seconds", "120"],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ports = json.loads(self.server.stdout.readline())
        self.control = f"http://127.0.0.1:{ports['control_port']}"
        self.control_call("PUT", "/_test/state", {"trainjobs": {"team-a": {"job-p": {"metadata": {"name": "job-p"}}}}})
        token = os.path.join(self.dir.name, "token")
        with open(token, "w") as f:
            f.write(STATUS_TOKEN + "\n")
        self.env = {"KUBEFLOW_TRAINER_SERVER_URL": f"https://127.0.0.1:{ports['port']}/apis/trainer.kubeflow.org/"
                                                   "v1alpha1/namespaces/team-a/trainjobs/job-p/status",
                    "KUBEFLOW_TRAINER_SERVER_CA_CERT": os.path.join(pki, "ca.crt"),
                    "KUBEFLOW_TRAINER_SERVER_TOKEN": token}
        self.environ = mock.patch.dict(os.environ, self.env)  # restored as it was by stop()
        self.environ.start()
        self.reset_module()

    def tearDown(self):
        self.environ.stop()
        self.reset_module()
        self.server.stdin.close()
        self.server.wait(timeout=10)
        self.dir.cleanup()

    @staticmethod
    def reset_module():
        utils._last_update_time = 0.0
        utils._cached_token = None
        utils._token_read_time = 0.0

    def control_call(self, method, path, body=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.control + path, data=data, method=method)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"{}")

    def status_posts(self):
        return [r for r in self.control_call("GET", "/_test/requests")["requests"]
                if r["method"] == "POST" and r["path"].endswith("/trainjobs/job-p/status")]

    def test_an_update_reaches_the_trainjobs_status_and_the_next_is_throttled(self):
        self.assertTrue(ktune.update_trainjob_status(progress_percent=140, estimated_remaining_seconds=-5,
                                                     metrics={"loss": 1.25, "step": 7, "phase": "train"}))
        posts = self.status_posts()
        self.assertEqual(len(posts), 1)
        self.assertEqual(posts[0]["headers"]["authorization"], "Bearer " + STATUS_TOKEN)
        self.assertTrue(posts[0]["tls"])
        ts = posts[0]["body"]["trainerStatus"]
        self.assertEqual(ts["progressPercentage"], 100)  # clamped
        self.assertEqual(ts["estimatedRemainingSeconds"], 0)
        self.assertEqual(ts["metrics"], [{"name": "loss", "value": "1.25"}, {"name": "step", "value": "7"},
                                         {"name": "phase", "value": "train"}])
        # Within 5 s: not sent.
        self.assertFalse(ktune.update_trainjob_status(progress_percent=50))
        self.assertEqual(len(self.status_posts()), 1)

    def test_it_is_false_and_quiet_wherever_it_cannot_report(self):
        del os.environ["KUBEFLOW_TRAINER_SERVER_URL"]
        self.assertFalse(ktune.update_trainjob_status(progress_percent=1))  # not in a TrainJob
        os.environ.update(self.env)
        with open(self.env["KUBEFLOW_TRAINER_SERVER_TOKEN"], "w") as f:
            f.write("not-the-pods-token\n")
        with self.assertLogs("ktune.utils", logging.WARNING) as logs:
            self.assertFalse(ktune.update_trainjob_status(progress_percent=1))  # refused: 401
        self.assertIn("HTTP 401", "\n".join(logs.output))
        self.reset_module()
        os.environ["KUBEFLOW_TRAINER_SERVER_TOKEN"] = os.path.join(self.dir.name, "missing")
        self.assertFalse(ktune.update_trainjob_status(progress_percent=1))  # no token
        os.environ.update(self.env)
        with open(self.env["KUBEFLOW_TRAINER_SERVER_TOKEN"], "w") as f:
            f.write(STATUS_TOKEN)
        os.environ["KUBEFLOW_TRAINER_SERVER_CA_CERT"] = os.path.join(self.dir.name, "pki", "other-ca.crt")
        with self.assertLogs("ktune.utils", logging.WARNING):
            self.assertFalse(ktune.update_trainjob_status(progress_percent=1))  # a CA that did not sign the server
        self.assertTrue(all(p["headers"]["authorization"] != "Bearer " + STATUS_TOKEN for p in self.status_posts()))

    def test_upstreams_own_helper_is_taken_by_the_same_server(self):
        try:
            from kubeflow.trainer import update_trainjob_status as upstream
        except ImportError:
            self.skipTest("upstream's kubeflow SDK is not installed")
        self.assertTrue(upstream(progress_percent=45, estimated_remaining_seconds=795, metrics={"loss": 0.2347}))
        self.assertTrue(self.status_posts())


class GetTpuNumNodes(unittest.TestCase):
    def test_hosts_of_multi_slice_jobs(self):
        self.assertEqual(ktune.get_tpu_num_nodes(2, "2x2"), 2)      # 4 chips: one host a slice
        self.assertEqual(ktune.get_tpu_num_nodes(3, "2x2x4"), 12)   # 16 chips: 4 hosts a slice
        self.assertEqual(ktune.get_tpu_num_nodes(1, "4x4", chips_per_host=8), 2)
        self.assertEqual(ktune.get_tpu_num_nodes(1, "1x2"), 1)      # fewer chips than a host has
        for args, why in [((0, "2x2"), "num_slices must be positive"), ((1, ""), "must be specified"),
                          ((1, "2xa"), "Invalid topology format"), ((1, "2x2x2x2"), "exactly 2 or 3"),
                          ((1, "0x4"), "must be positive"), ((1, "2x3"), "cleanly divisible")]:
            with self.assertRaisesRegex(ValueError, why):
                ktune.get_tpu_num_nodes(*args)
        try:
            from kubeflow.trainer import get_tpu_num_nodes as upstream
        except ImportError:
            return
        for args in [(2, "2x2"), (3, "2x2x4"), (1, "4x4", 8), (1, "1x2"), (4, "4x4x4")]:
            self.assertEqual(ktune.get_tpu_num_nodes(*args), upstream(*args), args)


if __name__ == "__main__":
    unittest.main()
