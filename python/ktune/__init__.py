"""ktune: fine-tune LLMs with Kubeflow Trainer's Python SDK, run by ktune's native engine.

The names and shapes are upstream's (``kubeflow.trainer``), so the design's examples run with
``from ktune import ...`` in place of ``from kubeflow.trainer import ...``::

    from ktune import (TrainerClient, BuiltinTrainer, TorchTuneConfig, LoraConfig, Initializer,
                       HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, DataFormat,
                       TorchTuneInstructDataset)

    client = TrainerClient()                 # local backend: processes on this machine
    client.list_runtimes()                   # one torchtune runtime per model, plus torch-distributed
    job = client.train(runtime=client.get_runtime("torchtune-llama3.2-1b"), initializer=..., trainer=...)
    for line in client.get_job_logs(job, follow=True):
        print(line)
    client.wait_for_job_status(job)

``TrainerClient.plan(...)`` shows what ``train(...)`` would run and the TrainJob's YAML (a dry run).
See ``help(ktune.TrainerClient)`` and ``help(ktune.types)``.
"""

from . import constants, options, types
from .client import TrainerClient, TrainJobPlan, function_script
from .utils import get_tpu_num_nodes, update_trainjob_status
from .types import (BackendConfig, BackendKind, BuiltinTrainer, CustomTrainer, CustomTrainerContainer, DataCacheInitializer, DataFormat, DataType, Event,
                    HuggingFaceDatasetInitializer, HuggingFaceModelInitializer, Initializer, KubernetesBackendConfig, LoraConfig, Loss,
                    ContainerBackendConfig, LocalProcessBackendConfig, TrainingRuntimeSource, Runtime, RuntimeKind, RuntimeTrainer, S3DatasetInitializer, S3ModelInitializer, Step,
                    TorchTuneChatDataset, TorchTuneConfig, TorchTuneInstructDataset, TorchTuneMultimodalDataset,
                    TrainerType, TrainJob, TrainJobProgress, TrainJobTemplate)

__version__ = "0.1.0"

DATASET_PATH = constants.DATASET_PATH
MODEL_PATH = constants.MODEL_PATH

__all__ = [
    "BackendConfig", "BackendKind", "BuiltinTrainer", "ContainerBackendConfig", "CustomTrainer", "CustomTrainerContainer", "DATASET_PATH", "DataCacheInitializer", "DataFormat", "DataType", "Event",
    "HuggingFaceDatasetInitializer", "HuggingFaceModelInitializer", "Initializer", "KubernetesBackendConfig", "LocalProcessBackendConfig", "LoraConfig", "Loss", "MODEL_PATH",
    "Runtime", "RuntimeKind", "RuntimeTrainer", "S3DatasetInitializer", "S3ModelInitializer", "Step",
    "TorchTuneChatDataset", "TorchTuneConfig", "TorchTuneInstructDataset", "TorchTuneMultimodalDataset",
    "TrainJob", "TrainJobPlan", "TrainJobProgress", "TrainJobTemplate", "TrainerClient", "TrainerType", "TrainingRuntimeSource", "constants", "function_script",
    "get_tpu_num_nodes", "options", "types", "update_trainjob_status",
]
