"""The helpers upstream's SDK exports from ``kubeflow.trainer`` beside its types, with upstream's
names, arguments and behaviour:

``update_trainjob_status``  a custom trainer's progress into its TrainJob's status (Kubeflow Trainer
                            >= 2.2 with the TrainJobStatus feature gate, KEP-2779). ktune's own
                            trainer reports by itself (src/train/trainer_status.h); this is for the
                            training functions a CustomTrainer runs.
``get_tpu_num_nodes``       the hosts a multi-slice TPU job needs.

Only the standard library: a CustomTrainer's function runs in images that may hold nothing else.
"""
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from typing import Dict, Optional, Union

_logger = logging.getLogger(__name__)

# Injected by the controller into every container of the TrainJob.
_ENV_SERVER_URL = "KUBEFLOW_TRAINER_SERVER_URL"
_ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
_ENV_TOKEN_PATH = "KUBEFLOW_TRAINER_SERVER_TOKEN"

_MIN_UPDATE_INTERVAL_SECONDS = 5.0   # at most one update this often (the controller rate-limits too)
_TOKEN_CACHE_TTL_SECONDS = 300.0     # the projected token is re-read this often (the kubelet rotates it)
_MAX_METRICS_COUNT = 256

_lock = threading.Lock()
_last_update_time = 0.0              # monotonic time of the last update the controller took
_cached_token: Optional[str] = None
_token_read_time = 0.0


def _token(path: Optional[str]) -> Optional[str]:
    global _cached_token, _token_read_time
    now = time.monotonic()
    if _cached_token and now - _token_read_time < _TOKEN_CACHE_TTL_SECONDS:
        return _cached_token
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            _cached_token, _token_read_time = f.read().strip(), now
        return _cached_token
    except OSError as e:
        _logger.warning("Unable to read token from %s: %s", path, e)
        return None


def update_trainjob_status(progress_percent: Optional[int] = None,
                           estimated_remaining_seconds: Optional[int] = None,
                           metrics: Optional[Dict[str, Union[float, int, str]]] = None) -> bool:
    """Reports training progress to the Kubeflow Trainer controller, which writes it into the
    TrainJob's ``status.trainerStatus`` (``TrainerClient().get_job(name)``, ``kubectl get trainjob``).

    Safe to call anywhere: outside a TrainJob whose controller asked for it (no
    ``KUBEFLOW_TRAINER_SERVER_URL``) it returns False and does nothing. At most one update every
    5 seconds is sent (later calls within that time return False). It never raises.

    Args:
        progress_percent: completion in percent, clamped to [0, 100].
        estimated_remaining_seconds: the time left, in seconds (at least 0).
        metrics: metric name -> value, each sent as its ``str()``; the first 256.

    Returns:
        True when the controller took the update.
    """
    global _last_update_time
    try:
        url = os.environ.get(_ENV_SERVER_URL)
        if not url:
            return False
        with _lock:
            if time.monotonic() - _last_update_time < _MIN_UPDATE_INTERVAL_SECONDS:
                return False
            token = _token(os.environ.get(_ENV_TOKEN_PATH))
        if not token:
            _logger.debug("No authentication token available")
            return False
        status: dict = {"lastUpdatedTime": datetime.now(timezone.utc).isoformat()}
        if progress_percent is not None:
            status["progressPercentage"] = max(0, min(100, int(progress_percent)))
        if estimated_remaining_seconds is not None:
            status["estimatedRemainingSeconds"] = max(0, int(estimated_remaining_seconds))
        if metrics:
            if len(metrics) > _MAX_METRICS_COUNT:
                _logger.warning("metrics dict has %d entries, truncating to %d (SDK limit)", len(metrics),
                                _MAX_METRICS_COUNT)
                metrics = dict(list(metrics.items())[:_MAX_METRICS_COUNT])
            status["metrics"] = [{"name": str(k), "value": str(v)} for k, v in metrics.items()]
        ca_file = os.environ.get(_ENV_CA_CERT)
        context = ssl.create_default_context(cafile=ca_file if ca_file and os.path.exists(ca_file) else None)
        request = urllib.request.Request(url, data=json.dumps({"trainerStatus": status}).encode(), method="POST",
                                         headers={"Authorization": f"Bearer {token}",
                                                  "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=5) as response:
                code = response.status
        except urllib.error.HTTPError as e:
            _logger.warning("Status update failed: HTTP %s", e.code)
            return False
        if code != 200:
            _logger.warning("Status update failed: HTTP %s", code)
            return False
        with _lock:
            _last_update_time = time.monotonic()
        return True
    except (urllib.error.URLError, OSError, ValueError) as e:
        _logger.warning("Failed to send status update: %s", e)
        return False
    except Exception as e:  # noqa: BLE001 - never raises, as upstream's
        _logger.warning("Unexpected error in update_trainjob_status: %s", e)
        return False


def get_tpu_num_nodes(num_slices: int, topology: str, chips_per_host: int = 4) -> int:
    """The hosts (``num_nodes``) a TPU job of ``num_slices`` slices of ``topology`` ("2x2", "2x2x4",
    ...) needs, at ``chips_per_host`` chips a VM host (4 for ct6e-standard-4t, 8 for -8t).

    Raises:
        ValueError: a non-positive count, a topology not of 2 or 3 positive dimensions, or a
            multi-host slice whose chips the hosts do not divide.
    """
    if num_slices <= 0:
        raise ValueError(f"num_slices must be positive, got: {num_slices}")
    if chips_per_host <= 0:
        raise ValueError(f"chips_per_host must be positive, got: {chips_per_host}")
    if not topology:
        raise ValueError("TPU topology must be specified.")
    try:
        dims = [int(d) for d in topology.lower().split("x")]
    except ValueError:
        raise ValueError(f"Invalid topology format: '{topology}'. Must be formatted as 'AxB' or 'AxBxC' "
                         "(e.g. '2x2', '2x2x2').") from None
    if len(dims) not in (2, 3):
        raise ValueError(f"Invalid topology format: '{topology}'. Must contain exactly 2 or 3 dimensions "
                         "(e.g. '2x2', '2x2x2').")
    if any(d <= 0 for d in dims):
        raise ValueError(f"TPU topology dimensions must be positive, got: '{topology}'.")
    chips = 1
    for d in dims:
        chips *= d
    if chips < chips_per_host:
        return num_slices
    if chips % chips_per_host != 0:
        raise ValueError(f"Total TPU chips in slice ({chips}) must be cleanly divisible by chips_per_host "
                         f"({chips_per_host}).")
    return num_slices * (chips // chips_per_host)
