"""Constants of the SDK, with upstream's names and values (kubeflow.trainer.constants)."""

import os

UNKNOWN = "Unknown"

# TrainJob statuses: the SDK derives Created and Running itself.
TRAINJOB_CREATED = "Created"
TRAINJOB_RUNNING = "Running"
TRAINJOB_COMPLETE = "Complete"
TRAINJOB_FAILED = "Failed"

# The runtime a CustomTrainer runs on when train() names none ($DEFAULT_TRAINING_RUNTIME, as upstream).
DEFAULT_TRAINING_RUNTIME = os.getenv("DEFAULT_TRAINING_RUNTIME", "torch-distributed")

# A CustomTrainer's package indexes: the first is pip's index-url, the rest extra-index-urls
# ($DEFAULT_PIP_INDEX_URLS, comma-separated, as upstream: an air-gapped cluster's mirror).
DEFAULT_PIP_INDEX_URLS = os.getenv("DEFAULT_PIP_INDEX_URLS", "https://pypi.org/simple").split(",")
INITIALIZER_DEFAULT_IGNORE_PATTERNS = ["*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth"]

# Step names: the initializers', and the trainer nodes' prefix (node-0, node-1, ...).
DATASET_INITIALIZER = "dataset-initializer"
MODEL_INITIALIZER = "model-initializer"
NODE = "node"

# A generated TrainJob name: a lower-case letter and this many hex digits.
JOB_NAME_UUID_LENGTH = 11

# Where the initializers put the data, as the trainer sees it.
WORKSPACE_PATH = "/workspace"
DATASET_PATH = "/workspace/dataset"
MODEL_PATH = "/workspace/model"
