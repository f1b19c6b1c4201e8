"""Constants of the SDK, with upstream's names and values (kubeflow.trainer.constants)."""

UNKNOWN = "Unknown"

# TrainJob statuses: the SDK derives Created and Running itself.
TRAINJOB_CREATED = "Created"
TRAINJOB_RUNNING = "Running"
TRAINJOB_COMPLETE = "Complete"
TRAINJOB_FAILED = "Failed"

# The runtime a CustomTrainer runs on when train() names none.
DEFAULT_TRAINING_RUNTIME = "torch-distributed"

DEFAULT_PIP_INDEX_URLS = ["https://pypi.org/simple"]
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
