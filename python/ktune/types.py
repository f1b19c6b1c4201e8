"""The SDK's types, named and shaped as upstream's ``kubeflow.trainer`` (SDK 0.5) spells them.

Every dataclass here has upstream's field names, order and defaults, so that code written for
``from kubeflow.trainer import ...`` runs with ``from ktune import ...``. ktune's C++ SDK reads
these objects by attribute name (python/src/ktune_module.cpp) and converts them to the structs of
src/runtime/sdk_types.h; nothing here plans or validates a TrainJob (the control plane does, and
reports every field at fault in one ValueError).

Where ktune differs, on purpose:
  * ``TorchTuneChatDataset`` and ``TorchTuneMultimodalDataset`` exist (the design, KEP-2401, names
    them; upstream's SDK 0.5 refuses them).
  * ``Runtime(name=...)`` alone is accepted (``trainer`` and ``kind`` default to None and
    ClusterTrainingRuntime): the design's own example passes just a name; the client looks the rest
    up in its catalog.
  * ``TorchTuneConfig.dtype``, ``.loss`` and a dataset's ``source`` also take their plain string
    values ("bf16", "parquet"), as the design's example writes ``dtype="bf16"``.
  * ``TrainJob.progress`` (last field, default None) carries what the trainer reports: percentage,
    remaining seconds, metrics such as loss. Upstream has no such signal.
  * ``BackendConfig`` chooses ktune's backend (local, the default, or Kubernetes);
    ``KubernetesBackendConfig`` keeps upstream's name and fields (namespace, config_file, context).
  * ``RuntimeTrainer.command`` is the runtime's entrypoint: ``("torchrun",)``, ``("python",)`` or
    ``("mpirun", "--hostfile", "/etc/mpi/hostfile", "python")`` for CustomTrainer runtimes, where
    upstream shows ``("bash", "-c", <the script that runs a function>)``; ``("tune", "run")`` as
    upstream for torchtune runtimes.
  * A count of 0 in ``TorchTuneConfig`` (``epochs``, ``batch_size``, ``num_nodes``) is refused with
    a ValueError naming the field; upstream drops it as if unset (a CustomTrainer's 0 is unset in both).

It deliberately holds no behaviour beyond small derived properties.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional, Union

from . import constants

__all__ = [
    "BackendConfig", "BackendKind", "BuiltinTrainer", "KubernetesBackendConfig", "CustomTrainer", "CustomTrainerContainer", "DataCacheInitializer", "DataFormat", "DataType", "Event",
    "HuggingFaceDatasetInitializer", "HuggingFaceModelInitializer", "Initializer", "LoraConfig", "Loss",
    "Runtime", "RuntimeKind", "RuntimeTrainer", "S3DatasetInitializer", "S3ModelInitializer", "Step",
    "TorchTuneChatDataset", "TorchTuneConfig", "TorchTuneInstructDataset", "TorchTuneMultimodalDataset",
    "TrainJob", "TrainJobProgress", "TrainJobTemplate", "TrainerType",
]


# ---- trainers ----------------------------------------------------------------------------------

@dataclass
class CustomTrainer:
    """Custom Trainer configuration: a self-contained function that encapsulates the entire model
    training process.

    The function's source (``inspect.getsource``) and a call with ``func_args`` (as keyword
    arguments) become a script that every node runs with the runtime's entrypoint (``torchrun`` on
    ``torch-distributed``), so ``torch.distributed`` code sees ``RANK``, ``WORLD_SIZE``,
    ``MASTER_ADDR``, ... The function must therefore import what it uses inside its body.

    Args:
        func: The function that encapsulates the entire model training process.
        func_args: The arguments to pass to the function (as keyword arguments).
        image: The optional container image to use in TrainJob (Kubernetes).
        packages_to_install: Python packages to ``pip install`` before running the function.
        pip_index_urls: The PyPI URLs to install them from: the first is the index-url, the others
            extra-index-urls.
        num_nodes: The number of nodes to use for training.
        resources_per_node: The computing resources per node, e.g. ``{"gpu": 4, "cpu": 5, "memory": "10G"}``.
        env: Environment variables to set in the training nodes.
    """

    func: Callable
    func_args: Optional[dict] = None
    image: Optional[str] = None
    packages_to_install: Optional[list[str]] = None
    pip_index_urls: list[str] = field(default_factory=lambda: list(constants.DEFAULT_PIP_INDEX_URLS))
    num_nodes: Optional[int] = None
    resources_per_node: Optional[dict] = None
    env: Optional[dict[str, str]] = None


@dataclass
class CustomTrainerContainer:
    """Custom Trainer Container configuration: a container image that encapsulates the entire model
    training process. Every node runs the image, with the runtime's command unless the
    ``TrainerCommand`` / ``TrainerArgs`` options replace it (on ``torch-distributed``, which gives no
    command, the image's own entrypoint). It needs a cluster: the Kubernetes backend runs it, the
    local backend refuses it.

    Args:
        image: The container image that encapsulates the entire model training process.
        num_nodes: The number of nodes to use for training.
        resources_per_node: The computing resources per node, e.g. ``{"gpu": 4, "cpu": 5, "memory": "10G"}``.
        env: Environment variables to set in the training nodes.
    """

    image: str
    num_nodes: Optional[int] = None
    resources_per_node: Optional[dict] = None
    env: Optional[dict[str, str]] = None


class RuntimeKind(enum.Enum):
    """The Kind name of a runtime."""

    CLUSTER_TRAINING_RUNTIME = "ClusterTrainingRuntime"
    TRAINING_RUNTIME = "TrainingRuntime"


class Loss(enum.Enum):
    """Loss function for the TorchTune LLM Trainer."""

    CEWithChunkedOutputLoss = "torchtune.modules.loss.CEWithChunkedOutputLoss"


class DataType(enum.Enum):
    """Data type for the TorchTune LLM Trainer."""

    BF16 = "bf16"
    FP32 = "fp32"


class DataFormat(enum.Enum):
    """Data file type for the TorchTune LLM Trainer."""

    JSON = "json"
    CSV = "csv"
    PARQUET = "parquet"
    ARROW = "arrow"
    TEXT = "text"
    XML = "xml"


@dataclass
class TorchTuneInstructDataset:
    """Instruction dataset (torchtune.datasets.instruct_dataset): prompts and model responses.

    Args:
        source: Data file type (``DataFormat``).
        split: The split of the dataset to use, e.g. ``"train[:10%]"``. Default ``train``.
        train_on_input: Whether the model is trained on the user prompt too. Default False.
        new_system_prompt: A system prompt prepended to every sample.
        column_map: Maps the expected ``"input"``/``"output"`` column names to the dataset's.
    """

    source: Optional[DataFormat] = None
    split: Optional[str] = None
    train_on_input: Optional[bool] = None
    new_system_prompt: Optional[str] = None
    column_map: Optional[dict[str, str]] = None


@dataclass
class TorchTuneChatDataset:
    """Chat dataset (torchtune.datasets.chat_dataset), as the design (KEP-2401) defines it.

    Args:
        source: Data file type (``DataFormat``).
        split: The split of the dataset to use.
        conversation_column: The column holding the conversations.
        conversation_style: ``"sharegpt"`` or ``"openai"``.
        train_on_input: Whether the model is trained on the user turns too.
        new_system_prompt: A system prompt prepended to every conversation.
    """

    source: Optional[DataFormat] = None
    split: Optional[str] = None
    conversation_column: Optional[str] = None
    conversation_style: Optional[str] = None
    train_on_input: Optional[bool] = None
    new_system_prompt: Optional[str] = None


@dataclass
class TorchTuneMultimodalDataset:
    """Multimodal chat dataset (torchtune.datasets.multimodal.multimodal_chat_dataset), as the design
    (KEP-2401) defines it.

    Args:
        source: Data file type (``DataFormat``).
        split: The split of the dataset to use.
        column_map: Maps the expected column names to the dataset's.
        image_dir: The directory holding the images.
        image_tag: The placeholder tag for an image in the text.
    """

    source: Optional[DataFormat] = None
    split: Optional[str] = None
    column_map: Optional[dict[str, str]] = None
    image_dir: Optional[str] = None
    image_tag: Optional[str] = None


@dataclass
class LoraConfig:
    """Configuration for LoRA, QLoRA and DoRA.

    Args:
        apply_lora_to_mlp: Whether to apply LoRA to the MLP in each transformer layer.
        apply_lora_to_output: Whether to apply LoRA to the model's final output projection.
        lora_attn_modules: Which attention projections get LoRA (``q_proj``, ``k_proj``,
            ``v_proj``, ``output_proj``); default ``["q_proj", "v_proj", "output_proj"]``.
        lora_rank: The rank of the low rank decomposition.
        lora_alpha: The scaling factor of the low-rank update.
        lora_dropout: The probability of dropout on the low rank updates.
        quantize_base: Whether to quantize the base model (QLoRA).
        use_dora: Whether to enable DoRA.
    """

    apply_lora_to_mlp: Optional[bool] = None
    apply_lora_to_output: Optional[bool] = None
    lora_attn_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj", "output_proj"])
    lora_rank: Optional[int] = None
    lora_alpha: Optional[int] = None
    lora_dropout: Optional[float] = None
    quantize_base: Optional[bool] = None
    use_dora: Optional[bool] = None


@dataclass
class TorchTuneConfig:
    """TorchTune LLM Trainer configuration: the parameters of a builtin fine-tuning recipe. The
    control plane picks the recipe and config from the runtime's model, the node and process counts
    and ``peft_config``; these fields become the config overrides.

    Args:
        dtype: The data type of the model and optimizer parameters (``DataType.BF16``/``FP32``).
        batch_size: The number of samples processed before updating model weights.
        epochs: The number of complete passes over the training dataset.
        loss: The loss (``Loss.CEWithChunkedOutputLoss``).
        num_nodes: The number of nodes to use for training.
        peft_config: LoRA/QLoRA/DoRA (``LoraConfig``); None for a full fine-tune.
        dataset_preprocess_config: How to read the dataset (``TorchTuneInstructDataset``, or ktune's
            ``TorchTuneChatDataset`` / ``TorchTuneMultimodalDataset``).
        resources_per_node: The computing resources per node, e.g. ``{"gpu": 1}``.
    """

    dtype: Optional[DataType] = None
    batch_size: Optional[int] = None
    epochs: Optional[int] = None
    loss: Optional[Loss] = None
    num_nodes: Optional[int] = None
    peft_config: Optional[LoraConfig] = None
    dataset_preprocess_config: Optional[
        Union[TorchTuneInstructDataset, TorchTuneChatDataset, TorchTuneMultimodalDataset]
    ] = None
    resources_per_node: Optional[dict] = None


@dataclass
class BuiltinTrainer:
    """Builtin Trainer configuration: the trainer already includes the fine-tuning logic and needs
    only parameter adjustments.

    Args:
        config: The configuration for the builtin trainer (``TorchTuneConfig``).
    """

    config: TorchTuneConfig


class TrainerType(enum.Enum):
    """The trainer a runtime takes: ``CustomTrainer`` (your function) or ``BuiltinTrainer`` (torchtune)."""

    CUSTOM_TRAINER = CustomTrainer.__name__
    BUILTIN_TRAINER = BuiltinTrainer.__name__


# ---- runtimes and jobs, as the SDK shows them --------------------------------------------------

@dataclass
class RuntimeTrainer:
    """The trainer of a runtime: type, framework, image, nodes, devices and entrypoint."""

    trainer_type: TrainerType
    framework: str
    image: str
    num_nodes: int = 1
    device: str = constants.UNKNOWN
    device_count: str = constants.UNKNOWN
    __command: tuple[str, ...] = field(init=False, repr=False, default=())

    @property
    def command(self) -> tuple[str, ...]:
        """The runtime's entrypoint, e.g. ``("tune", "run")`` or ``("torchrun",)``."""
        return self.__command

    def set_command(self, command: tuple[str, ...]):
        self.__command = tuple(command)


@dataclass
class Runtime:
    """A ClusterTrainingRuntime or TrainingRuntime. ``Runtime(name=...)`` alone names one of the
    catalog's (see ``TrainerClient.list_runtimes()``)."""

    name: str
    trainer: Optional[RuntimeTrainer] = None
    kind: RuntimeKind = RuntimeKind.CLUSTER_TRAINING_RUNTIME
    pretrained_model: Optional[str] = None


@dataclass
class Step:
    """One step of a TrainJob: ``dataset-initializer``, ``model-initializer``, ``node-0``, ...

    ``status`` is, as upstream's, the pod's phase on Kubernetes (``Pending``, ``Running``,
    ``Succeeded``, ``Failed``) and the job's words on the local backend (``Created``, ``Running``,
    ``Complete``, ``Failed``)."""

    name: str
    status: Optional[str]
    pod_name: str
    device: str = constants.UNKNOWN
    device_count: str = constants.UNKNOWN


@dataclass
class TrainJobProgress:
    """What the trainer reports while it runs (ktune's addition).

    Args:
        progress_percentage: 0..100, or None before the first report.
        estimated_remaining_seconds: The trainer's estimate, or None.
        metrics: Latest values, e.g. ``{"loss": 2.31, "lr": 0.0003, "tokens_per_second": 812.0}``.
    """

    progress_percentage: Optional[int] = None
    estimated_remaining_seconds: Optional[int] = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class TrainJob:
    """A submitted TrainJob as the SDK shows it. ``status`` is one of Created, Running, Complete,
    Failed."""

    name: str
    runtime: Runtime
    steps: list[Step]
    num_nodes: int
    creation_timestamp: datetime
    status: str = constants.UNKNOWN
    progress: Optional[TrainJobProgress] = None


@dataclass
class Event:
    """A cluster event about a TrainJob, its JobSet, Jobs or pods (``get_job_events``)."""

    involved_object_kind: str
    involved_object_name: str
    message: str
    reason: str
    event_time: datetime


# ---- initializers ------------------------------------------------------------------------------

@dataclass
class HuggingFaceDatasetInitializer:
    """Downloads a dataset into /workspace/dataset.

    Args:
        storage_uri: ``hf://org/repo[/path]`` (or ``org/repo[/path]``); ktune also takes
            ``file:///local/folder`` or ``file:///local/file.parquet``.
        ignore_patterns: File patterns not to download.
        access_token: Hugging Face Hub token for private datasets (never printed or stored).
    """

    storage_uri: str
    ignore_patterns: Optional[list[str]] = None
    access_token: Optional[str] = None


@dataclass
class S3DatasetInitializer:
    """Downloads a dataset from S3-compatible storage into /workspace/dataset.

    Args:
        storage_uri: ``s3://bucket/path``.
        ignore_patterns: File patterns not to download.
        endpoint: Custom S3 endpoint URL.
        access_key_id: Access key.
        secret_access_key: Secret key (never printed or stored).
        region: Region.
        role_arn: The ARN of a role to assume.
    """

    storage_uri: str
    ignore_patterns: Optional[list[str]] = None
    endpoint: Optional[str] = None
    access_key_id: Optional[str] = None
    secret_access_key: Optional[str] = None
    region: Optional[str] = None
    role_arn: Optional[str] = None

    def __post_init__(self):
        if not self.storage_uri.startswith("s3://"):
            raise ValueError(f"storage_uri must start with 's3://', got {self.storage_uri}")


@dataclass
class DataCacheInitializer:
    """Upstream's distributed data cache for training: an Iceberg table served by cache nodes, which a
    ``CustomTrainer``'s function reads. The cache runs in the cluster (a runtime such as upstream's
    ``torch-distributed-with-cache``), so the Kubernetes backend takes it and the local backend
    refuses it; a torchtune runtime refuses it too (its trainer reads files).

    Args:
        storage_uri: ``cache://<SCHEMA_NAME>/<TABLE_NAME>``.
        metadata_loc: The metadata file path of the Iceberg table.
        num_data_nodes: The number of data nodes of the cache (more than 1).
        head_cpu: CPU for the cache's head node.
        head_mem: Memory for the cache's head node.
        worker_cpu: CPU for each cache worker node.
        worker_mem: Memory for each cache worker node.
        iam_role: The IAM role for reading metadata_loc.
    """

    storage_uri: str
    metadata_loc: str
    num_data_nodes: int
    head_cpu: Optional[str] = None
    head_mem: Optional[str] = None
    worker_cpu: Optional[str] = None
    worker_mem: Optional[str] = None
    iam_role: Optional[str] = None

    def __post_init__(self):
        if self.num_data_nodes <= 1:
            raise ValueError(f"num_data_nodes must be greater than 1, got {self.num_data_nodes}")
        if not self.storage_uri.startswith("cache://"):
            raise ValueError(f"storage_uri must start with 'cache://', got {self.storage_uri}")
        if len(self.storage_uri[len("cache://"):].split("/")) != 2:
            raise ValueError(f"storage_uri must be in format 'cache://<SCHEMA_NAME>/<TABLE_NAME>', got {self.storage_uri}")


@dataclass
class HuggingFaceModelInitializer:
    """Downloads a model into /workspace/model.

    Args:
        storage_uri: ``hf://org/repo`` (or ``org/repo``); ktune also takes ``file:///local/folder``.
        ignore_patterns: File patterns not to download (default: msgpack, h5, bin, pt, pth weights).
        access_token: Hugging Face Hub token for gated models (never printed or stored).
    """

    storage_uri: str
    ignore_patterns: Optional[list[str]] = field(
        default_factory=lambda: list(constants.INITIALIZER_DEFAULT_IGNORE_PATTERNS))
    access_token: Optional[str] = None


@dataclass
class S3ModelInitializer:
    """Downloads a model from S3-compatible storage into /workspace/model (fields as
    ``S3DatasetInitializer``)."""

    storage_uri: str
    ignore_patterns: Optional[list[str]] = field(
        default_factory=lambda: list(constants.INITIALIZER_DEFAULT_IGNORE_PATTERNS))
    endpoint: Optional[str] = None
    access_key_id: Optional[str] = None
    secret_access_key: Optional[str] = None
    region: Optional[str] = None
    role_arn: Optional[str] = None

    def __post_init__(self):
        if not self.storage_uri.startswith("s3://"):
            raise ValueError(f"storage_uri must start with 's3://', got {self.storage_uri}")


@dataclass
class Initializer:
    """The dataset and pre-trained model initializers of a TrainJob.

    Args:
        dataset: ``HuggingFaceDatasetInitializer``, ``S3DatasetInitializer`` or (Kubernetes)
            ``DataCacheInitializer``.
        model: ``HuggingFaceModelInitializer`` or ``S3ModelInitializer``.
    """

    dataset: Optional[Union[HuggingFaceDatasetInitializer, S3DatasetInitializer, DataCacheInitializer]] = None
    model: Optional[Union[HuggingFaceModelInitializer, S3ModelInitializer]] = None


@dataclass
class TrainJobTemplate:
    """A TrainJob's parts kept together, as upstream's ``TrainJobTemplate``: a mapping of the
    ``train()`` arguments, so that ``client.train(**template)`` starts it (and templates can be
    kept, copied and changed before they run).

    Args:
        trainer: a ``CustomTrainer`` (upstream's type), or, with ktune, any trainer ``train()`` takes.
        runtime: a runtime name or ``Runtime`` (default: ``torch-distributed``).
        initializer: the dataset and model initializers.
    """

    trainer: Union["CustomTrainer", "CustomTrainerContainer", "BuiltinTrainer"]
    runtime: Optional[Union[str, "Runtime"]] = None
    initializer: Optional[Initializer] = None

    def keys(self):
        return ["trainer", "runtime", "initializer"]

    def __getitem__(self, key):
        return getattr(self, key)


# ---- the backend -------------------------------------------------------------------------------

class BackendKind(enum.Enum):
    """Where TrainJobs run."""

    LOCAL = "local"
    KUBERNETES = "kubernetes"


@dataclass(kw_only=True)
class BackendConfig:
    """ktune's backend choice (the C++ ``sdk::BackendConfig``). Fields left None take the
    environment's values (``KTUNE_BACKEND``, ``KTUNE_HOME``, ``KTUNE_EXE``, ``KTUNE_TRAINER_COMMAND``)
    or the defaults.

    Args:
        kind: ``BackendKind.LOCAL`` (processes on this machine, jobs in a SQLite registry under
            ``home``) or ``BackendKind.KUBERNETES``. None: ``$KTUNE_BACKEND``, else local.
        home: The local backend's registry and job folders (default ``$KTUNE_HOME``, else ``~/.ktune``).
        workspace_root: A job's workspace is ``<workspace_root>/<name>`` (default ``<home>/jobs``).
        ktune_exe: The ``ktune`` binary that supervises jobs and stands for ``tune``. Default:
            ``$KTUNE_EXE``, else the one installed with this package, else ``ktune`` on PATH.
        trainer_command: Replaces a node's leading ``tune run`` (another trainer, tests).
        stop_grace_seconds: SIGTERM to SIGKILL delay when stopping a job's processes.
        namespace: The Kubernetes namespace (default: the kubeconfig context's, else ``default``).
        config_file: The kubeconfig (default ``$KUBECONFIG``, else ``~/.kube/config``, else in-cluster).
        context: The kubeconfig context (default: its current-context).
    """

    kind: Optional[BackendKind] = None
    home: Optional[str] = None
    workspace_root: Optional[str] = None
    ktune_exe: Optional[str] = None
    trainer_command: Optional[list[str]] = None
    stop_grace_seconds: Optional[float] = None
    namespace: Optional[str] = None
    config_file: Optional[str] = None
    context: Optional[str] = None


@dataclass(kw_only=True)
class KubernetesBackendConfig(BackendConfig):
    """``BackendConfig`` for the Kubernetes backend, under upstream's name (``namespace``,
    ``config_file``, ``context``; by keyword only, as upstream's pydantic model takes them)."""

    def __post_init__(self):
        self.kind = BackendKind.KUBERNETES


@dataclass(kw_only=True)
class LocalProcessBackendConfig(BackendConfig):
    """Upstream's ``LocalProcessBackendConfig``: the local backend. ``cleanup_venv`` is kept for
    upstream's signature only: ktune's local jobs run in no virtual environment of their own, so
    there is none to remove."""

    cleanup_venv: bool = True

    def __post_init__(self):
        self.kind = BackendKind.LOCAL


@dataclass
class TrainingRuntimeSource:
    """Upstream's runtime sources of its container backend (``github://``, ``https://``,
    ``file://`` URLs); ktune's local backend uses its own bundled runtimes, whatever these say."""

    sources: list[str] = field(default_factory=lambda: ["github://kubeflow/trainer"])


@dataclass(kw_only=True)
class ContainerBackendConfig(BackendConfig):
    """Upstream's ``ContainerBackendConfig``, with its fields. ktune's trainer and initializers are
    native programs, so the steps upstream would start in Docker or Podman containers run as
    processes on this machine (the local backend, said in a warning when the client is made):
    the images, pull policy, container host and runtime sources are not used."""

    pull_policy: str = "IfNotPresent"
    auto_remove: bool = True
    container_host: Optional[str] = None
    container_runtime: Optional[str] = None
    runtime_source: TrainingRuntimeSource = field(default_factory=TrainingRuntimeSource)
    dataset_initializer_image: str = "ghcr.io/kubeflow/trainer/dataset-initializer:latest"
    model_initializer_image: str = "ghcr.io/kubeflow/trainer/model-initializer:latest"
    initializer_timeout: int = 600

    def __post_init__(self):
        self.kind = BackendKind.LOCAL


@dataclass
class _CustomTrainerSpec:
    """A CustomTrainer as the C++ SDK takes it (runtime/sdk_types.h): a command, or a script's text
    run with the runtime's entrypoint. TrainerClient makes one from a CustomTrainer's function."""

    command: list[str] = field(default_factory=list)
    script: str = ""
    args: list[str] = field(default_factory=list)
    env: Optional[dict[str, str]] = None
    packages_to_install: Optional[list[str]] = None
    pip_index_urls: Optional[list[str]] = None
    num_nodes: Optional[int] = None
    resources_per_node: Optional[dict] = None
    image: Optional[str] = None
