"""TrainerClient: upstream's ``kubeflow.trainer.TrainerClient``, method for method, over ktune's C++
SDK (src/sdk/trainer_client.h) through the native module ``ktune._ktune``.

What happens here, and only here, in Python: a runtime given by name or as a ``Runtime`` becomes
its name; a ``CustomTrainer``'s function becomes the script the C++ CustomTrainer runs (upstream's
way: ``inspect.getsource`` plus a call with ``func_args``); the C++ results (dicts) become the
dataclasses of ``ktune.types``; a followed log becomes a generator. Planning, validation, the
backends, waiting and every error message are the C++ SDK's (the CLI runs the very same code), so
the Python face cannot drift from it.

ktune's additions: ``plan()`` (what ``train()`` would submit, with the TrainJob's YAML: a dry run),
``train(..., name=...)`` (the same as ``options=[Name(...)]``), ``delete_job(..., remove_workspace=True)``
and ``TrainJob.progress``.
"""

from __future__ import annotations

import inspect
import json
import os
import textwrap
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Optional, Union

from . import constants
from .types import (BackendConfig, BackendKind, BuiltinTrainer, CustomTrainer, CustomTrainerContainer, Event, Initializer, Runtime,
                    RuntimeKind, RuntimeTrainer, Step, TrainerType, TrainJob, TrainJobProgress,
                    _CustomTrainerSpec)

__all__ = ["TrainerClient", "TrainJobPlan"]

_OPTIONS_TAKEN = "Name, Labels, Annotations, ActiveDeadlineSeconds, TrainerCommand and TrainerArgs"


def _native():
    try:
        from . import _ktune
    except ImportError as e:  # the pure-Python types still import; the client needs the module
        raise ImportError(
            "ktune's native module (ktune._ktune) is not built: build the CMake target _ktune "
            "(PYTHONPATH=<build>/python) or `pip install .` at the repository root") from e
    return _ktune


def _default_ktune_exe(native) -> Optional[str]:
    """The ktune binary installed with the package, else the build tree's; None leaves the choice to
    the C++ default ($KTUNE_EXE, else `ktune` on PATH)."""
    if os.environ.get("KTUNE_EXE"):
        return None
    bundled = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ktune")
    for candidate in (bundled, native.build_tree_ktune_exe):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _runtime_from_dict(d: dict) -> Runtime:
    t = d["trainer"]
    trainer = RuntimeTrainer(trainer_type=TrainerType(t["trainer_type"]), framework=t["framework"],
                             image=t["image"], num_nodes=t["num_nodes"], device=t["device"],
                             device_count=t["device_count"])
    trainer.set_command(tuple(t["command"]))
    return Runtime(name=d["name"], trainer=trainer, kind=RuntimeKind(d["kind"]),
                   pretrained_model=d["pretrained_model"])


def _timestamp(text: str) -> Optional[datetime]:
    """RFC 3339 in UTC ("2026-12-02T10:00:00Z", fractional seconds allowed) as an aware datetime."""
    if not text:
        return None
    whole = text.split(".")[0].rstrip("Z")
    return datetime.strptime(whole, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)


def _job_from_dict(d: dict) -> TrainJob:
    p = d["progress"]
    progress = TrainJobProgress(progress_percentage=p["progress_percentage"],
                                estimated_remaining_seconds=p["estimated_remaining_seconds"],
                                metrics={k: float(v) for k, v in p["metrics"].items()})
    return TrainJob(name=d["name"], runtime=_runtime_from_dict(d["runtime"]),
                    steps=[Step(**s) for s in d["steps"]], num_nodes=d["num_nodes"],
                    creation_timestamp=_timestamp(d["creation_timestamp"]), status=d["status"],
                    progress=progress)


def function_script(func: Callable, func_args: Optional[dict] = None) -> str:
    """The script a CustomTrainer's function becomes, as upstream builds it: the function's
    dedented source, then ``func()`` or ``func(**func_args)``."""
    if not callable(func):
        raise ValueError(f"Training function must be callable, got function type: {type(func)}")
    if not func.__name__.isidentifier():
        raise ValueError(f"CustomTrainer.func: {func.__name__} cannot be called by name in the shipped script; "
                         "define the function with `def`")
    try:
        code = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError) as e:
        raise ValueError(f"CustomTrainer.func: cannot read the source of {func!r} ({e}); define the "
                         "function with `def` in a file or a notebook cell") from e
    if func_args is None:
        call = f"{func.__name__}()"
    else:
        if not isinstance(func_args, dict):
            raise ValueError(f"CustomTrainer.func_args: expected a dict, got {type(func_args).__name__}")
        call = f"{func.__name__}(**{func_args!r})"
    return f"{code}\n{call}\n"


def _kind(obj) -> str:
    """The class ``obj`` is, by name: the nearest ktune or upstream kubeflow class in its MRO (a
    subclass of one counts as it), else its own class's name (the native module reads the same way)."""
    for cls in type(obj).__mro__:
        if str(getattr(cls, "__module__", "")).startswith(("ktune", "kubeflow")):
            return cls.__name__
    return type(obj).__name__


def _trainer_spec(trainer):
    """What the native module takes: BuiltinTrainer and CustomTrainerContainer as they are, a
    CustomTrainer as a script."""
    if trainer is None or isinstance(trainer, BuiltinTrainer) or _kind(trainer) == "BuiltinTrainer":
        return trainer
    if isinstance(trainer, CustomTrainer) or _kind(trainer) == "CustomTrainer":
        return _CustomTrainerSpec(script=function_script(trainer.func, trainer.func_args), env=trainer.env,
                                  packages_to_install=trainer.packages_to_install,
                                  pip_index_urls=trainer.pip_index_urls, num_nodes=trainer.num_nodes,
                                  resources_per_node=trainer.resources_per_node, image=trainer.image)
    if isinstance(trainer, _CustomTrainerSpec) or _kind(trainer) == "CustomTrainerContainer":
        return trainer  # the native module reads a CustomTrainerContainer (ktune's or upstream's) by its fields
    raise ValueError(f"trainer: expected a BuiltinTrainer, a CustomTrainer or a CustomTrainerContainer, "
                     f"got {type(trainer).__name__}")


def _job_options(options, name: Optional[str]) -> dict:
    """``train(options=[...])`` (ktune.options or upstream's kubeflow.trainer.options objects, read by
    class name and fields) and ktune's ``name=`` as the native plan's keyword arguments."""
    out = {"name": name or "", "labels": {}, "annotations": {}, "active_deadline_seconds": None,
           "trainer_command": None, "trainer_args": None}
    if options is None:
        return out
    if not isinstance(options, (list, tuple)):
        raise ValueError(f"options: expected a list of options, got {type(options).__name__}")
    for option in options:
        kind = _kind(option)
        if kind == "Name":
            if not isinstance(option.name, str) or not option.name:
                raise ValueError(f"options: Name.name must be a non-empty string, got {option.name!r}")
            if name and option.name != name:
                raise ValueError(f"options: Name({option.name!r}) and name={name!r} disagree")
            out["name"] = option.name
        elif kind in ("Labels", "Annotations"):
            field_name = kind.lower()
            values = getattr(option, field_name)
            if not isinstance(values, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in values.items()):
                raise ValueError(f"options: {kind}.{field_name} must be a dict of strings to strings, got {values!r}")
            out[field_name] = dict(values)  # as upstream: the last Labels (Annotations) option is the one
        elif kind == "ActiveDeadlineSeconds":
            if type(option.seconds) is not int or option.seconds < 1:
                raise ValueError("activeDeadlineSeconds must be a positive integer (minimum 1)")
            out["active_deadline_seconds"] = option.seconds
        elif kind in ("TrainerCommand", "TrainerArgs"):
            field_name = "command" if kind == "TrainerCommand" else "args"
            values = getattr(option, field_name)
            if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) for v in values):
                raise ValueError(f"options: {kind}.{field_name} must be a list of strings, got {values!r}")
            out["trainer_" + field_name] = list(values)
        else:
            raise ValueError(f"options: {kind} is not supported by ktune (it takes {_OPTIONS_TAKEN}; "
                             "TrainJobs are built by its control plane, which has no patch layer)")
    return out


def _print_packages():
    import shutil
    import subprocess
    import sys

    print(f"Python: {sys.version}")
    if shutil.which("pip"):
        print(subprocess.run(["pip", "list"], capture_output=True, text=True).stdout)
    else:
        print("Unable to get installed packages: pip command not found")
    if shutil.which("nvidia-smi"):
        print("Available GPUs on the single training node")
        print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)


def _backend_config(config) -> BackendConfig:
    """ktune's BackendConfig, or upstream's backend configs by class name: KubernetesBackendConfig
    (namespace, config_file, context) and LocalProcessBackendConfig (the local backend; its
    cleanup_venv has no meaning here). ContainerBackendConfig runs on the local backend too, with a
    warning: ktune's trainer and initializers are native programs, so the steps upstream would start
    in Docker or Podman containers run as processes on this machine (its images, pull policy,
    container host and runtime sources are not used); code written for it runs unchanged, the
    builtin trainer included (which upstream's container backend refuses)."""
    if config is None:
        return BackendConfig()
    kind = _kind(config)
    if isinstance(config, BackendConfig) and kind != "ContainerBackendConfig":
        return config
    if kind == "KubernetesBackendConfig":
        if getattr(config, "client_configuration", None) is not None:
            raise ValueError("KubernetesBackendConfig.client_configuration: ktune connects from a kubeconfig "
                             "(config_file, context) or the in-cluster service account, not a kubernetes client Configuration")
        return BackendConfig(kind=BackendKind.KUBERNETES, namespace=getattr(config, "namespace", None),
                             config_file=getattr(config, "config_file", None), context=getattr(config, "context", None))
    if kind == "LocalProcessBackendConfig":
        return BackendConfig(kind=BackendKind.LOCAL)
    if kind == "ContainerBackendConfig":
        import warnings
        warnings.warn("ContainerBackendConfig: ktune runs the job's steps as processes on this machine (its trainer "
                      "and initializers are native programs); no container runtime, image or pull policy is used",
                      stacklevel=3)
        if isinstance(config, BackendConfig):
            return config
        return BackendConfig(kind=BackendKind.LOCAL)
    raise ValueError(f"backend_config: {kind} is not a backend ktune has (it takes BackendConfig, "
                     "KubernetesBackendConfig, LocalProcessBackendConfig or ContainerBackendConfig)")


def _runtime_name(runtime) -> str:
    if runtime is None:
        return constants.DEFAULT_TRAINING_RUNTIME
    if isinstance(runtime, str):
        return runtime
    name = getattr(runtime, "name", None)
    if not isinstance(name, str):
        raise ValueError(f"runtime: expected a runtime name or a Runtime, got {type(runtime).__name__}")
    return name


class TrainJobPlan:
    """What ``train()`` would submit: the control plane's plan (recipe, config, steps with their
    commands and env) and the TrainJob object a Kubernetes backend would create.

    ``str(plan)`` is the plan as ``ktune train --dry-run`` prints it; ``plan.trainjob_yaml()`` is the
    TrainJob as YAML (``kubectl apply -f`` input; secrets shown as ``***``).
    """

    def __init__(self, native_plan):
        self._plan = native_plan

    job_name = property(lambda self: self._plan.job_name, doc="The TrainJob's name.")
    runtime_name = property(lambda self: self._plan.runtime_name, doc="The runtime it references.")
    trainer_type = property(lambda self: self._plan.trainer_type, doc="BuiltinTrainer or CustomTrainer.")
    num_nodes = property(lambda self: self._plan.num_nodes, doc="Nodes (PET_NNODES).")
    num_proc_per_node = property(lambda self: self._plan.num_proc_per_node, doc="Processes per node.")
    recipe = property(lambda self: self._plan.recipe, doc="The torchtune recipe, e.g. lora_finetune_single_device.")
    config = property(lambda self: self._plan.config, doc="The torchtune config, e.g. llama3_2/1B_lora_single_device.")
    model_key = property(lambda self: self._plan.model_key, doc="The model key from the runtime name, e.g. llama3_2/1B.")
    steps = property(lambda self: self._plan.steps,
                     doc="The steps in dependency order, each a dict (name, command, env, depends_on, ...).")
    trainer_command = property(lambda self: list(self._plan.trainer_command),
                               doc="The TrainJob's spec.trainer.command as the SDK set it.")
    trainer_args = property(lambda self: list(self._plan.trainer_args),
                            doc="The TrainJob's spec.trainer.args as the SDK rendered them.")

    def trainjob_yaml(self) -> str:
        """The TrainJob object (apiVersion trainer.kubeflow.org/v1alpha1) as YAML, secrets as ``***``."""
        return self._plan.trainjob_yaml()

    def __str__(self) -> str:
        return self._plan.to_text()

    def __repr__(self) -> str:
        return f"<TrainJobPlan {self.job_name} runtime={self.runtime_name} recipe={self.recipe} config={self.config}>"


class TrainerClient:
    """The data scientist's entry point: list runtimes, start TrainJobs, follow and wait for them.

    ``TrainerClient()`` uses the local backend (jobs run as processes on this machine and are kept in
    ``~/.ktune``, or ``$KTUNE_HOME``) unless ``KTUNE_BACKEND`` or ``backend_config`` says otherwise.

    Example::

        from ktune import *
        client = TrainerClient()
        job = client.train(
            runtime=client.get_runtime("torchtune-qwen2.5-0.5b"),
            initializer=Initializer(model=HuggingFaceModelInitializer(storage_uri="hf://Qwen/Qwen2.5-0.5B-Instruct")),
            trainer=BuiltinTrainer(config=TorchTuneConfig(epochs=1, peft_config=LoraConfig(lora_rank=8))))
        for line in client.get_job_logs(job, follow=True):
            print(line)
        client.wait_for_job_status(job)

    Errors: ``ValueError`` for a call the control plane refuses (its ``errors`` attribute lists
    every ``(field, problem)``), ``RuntimeError`` for a job that Failed while waiting and for backend
    failures, ``TimeoutError`` when a wait runs out of time.
    """

    def __init__(self, backend_config=None):
        native = _native()
        c = _backend_config(backend_config)
        kind = c.kind.value if isinstance(c.kind, BackendKind) else (c.kind or "")
        ktune_exe = c.ktune_exe if c.ktune_exe is not None else _default_ktune_exe(native)
        self._client = native.Client(kind=kind, home=c.home, workspace_root=c.workspace_root, ktune_exe=ktune_exe,
                                     trainer_command=c.trainer_command, stop_grace_seconds=c.stop_grace_seconds,
                                     kubernetes_namespace=c.namespace, kubeconfig=c.config_file,
                                     kubernetes_context=c.context)

    @property
    def backend(self) -> str:
        """The backend in use: ``"local"`` or ``"kubernetes"``."""
        return self._client.backend_kind()

    def list_runtimes(self) -> list[Runtime]:
        """The runtimes TrainJobs may use (those with a framework label), sorted by name."""
        return [_runtime_from_dict(d) for d in self._client.list_runtimes()]

    def get_runtime(self, name: str) -> Runtime:
        """One runtime by name; RuntimeError if there is none (the message lists those there are)."""
        return _runtime_from_dict(self._client.get_runtime(name))

    def get_runtime_packages(self, runtime: Union[str, Runtime]):
        """Prints the Python version, ``pip list`` and ``nvidia-smi`` of the runtime's trainer node, as
        upstream does: a CustomTrainer job that prints them runs on the runtime, its log is printed,
        and the job is deleted (with its workspace). ValueError for a BuiltinTrainer runtime;
        RuntimeError when the job fails (its log says why)."""
        rt = self.get_runtime(_runtime_name(runtime))
        if rt.trainer.trainer_type == TrainerType.BUILTIN_TRAINER:
            raise ValueError("Cannot get Runtime packages for BuiltinTrainer")
        job, error = None, None
        try:
            # As upstream: one node, and one CPU unless the runtime's trainer has GPUs (not its full request).
            job = self.train(runtime=rt, trainer=CustomTrainer(
                func=_print_packages, num_nodes=1, resources_per_node={"cpu": 1} if rt.trainer.device != "gpu" else None))
            try:
                self.wait_for_job_status(job)
            except BaseException as e:
                error = e
            try:  # the log, the wait's error or not (it says why the job failed)
                print("\n".join(self.get_job_logs(job)))
            except Exception:
                if error is None:
                    raise
            if error is not None:
                raise error
        except BaseException as e:
            error = error or e
            raise
        finally:  # the cleanup's own failure never hides the error that came first
            if job is not None:
                try:
                    self.delete_job(job, remove_workspace=True)
                except Exception:
                    if error is None:
                        raise

    def plan(self, runtime: Union[str, Runtime, None] = None, initializer: Optional[Initializer] = None,
             trainer: Union[CustomTrainer, CustomTrainerContainer, BuiltinTrainer, None] = None,
             options: Optional[list] = None, *,
             name: Optional[str] = None) -> TrainJobPlan:
        """What ``train()`` would submit, without submitting it (a dry run). Same arguments as ``train()``;
        Kubernetes-only options are rendered into the TrainJob whatever the backend."""
        return TrainJobPlan(self._client.plan(_runtime_name(runtime), initializer, _trainer_spec(trainer),
                                              **_job_options(options, name)))

    def train(self, runtime: Union[str, Runtime, None] = None, initializer: Optional[Initializer] = None,
              trainer: Union[CustomTrainer, CustomTrainerContainer, BuiltinTrainer, None] = None,
             options: Optional[list] = None, *,
              name: Optional[str] = None) -> str:
        """Creates a TrainJob and returns its name (a letter and 11 hex digits, unless a name is given).

        Args:
            runtime: A runtime name or a ``Runtime`` (default: ``torch-distributed``).
            initializer: Where the dataset and the model come from (``Initializer``).
            trainer: ``BuiltinTrainer(config=TorchTuneConfig(...))`` for torchtune runtimes, or
                ``CustomTrainer(func=...)`` for ``torch-distributed`` (or, on Kubernetes,
                ``CustomTrainerContainer(image=...)``).
            options: upstream's options (``ktune.options`` or ``kubeflow.trainer.options``): ``Name``
                on every backend; ``Labels``, ``Annotations``, ``ActiveDeadlineSeconds``,
                ``TrainerCommand``, ``TrainerArgs`` on Kubernetes.
            name: ktune: the TrainJob's name (an RFC 1035 label), as ``options=[Name(name)]``.

        Raises:
            ValueError: the control plane refused the job; the message and ``.errors`` list every problem.
        """
        plan = self.plan(runtime, initializer, trainer, options, name=name)
        return self._client.submit(plan._plan)

    def list_jobs(self, runtime: Optional[Runtime] = None) -> list[TrainJob]:
        """The backend's TrainJobs, optionally only those of one runtime."""
        return [_job_from_dict(d) for d in self._client.list_jobs(_runtime_name(runtime) if runtime else "")]

    def get_job(self, name: str) -> TrainJob:
        """One TrainJob with its steps, status and progress; RuntimeError if there is none."""
        return _job_from_dict(self._client.get_job(name))

    def get_job_logs(self, name: str, step: str = "node-0", follow: Optional[bool] = False) -> Iterator[str]:
        """The lines of one step's log (``node-0``, ``dataset-initializer``, ``model-initializer``, ...).

        With ``follow=True`` the lines come as they are written, until the step ends; the wait for the
        next line releases the GIL. Closing the iterator early (``break``) stops the reader at its
        next line. On the local backend a step the job does not have raises RuntimeError naming the
        steps it has (upstream's local backend gives every step's lines for ``node-0``); on
        Kubernetes, as upstream's, a step without a pod yields no lines.
        """
        if not follow:
            return iter(self._client.get_job_logs(name, step))
        stream = self._client.follow_job_logs(name, step)

        def lines():
            try:
                yield from stream
            finally:
                stream.close()

        return lines()

    def wait_for_job_status(self, name: str, status: set[str] = {constants.TRAINJOB_COMPLETE}, timeout: int = 600,
                            polling_interval: int = 2,
                            callbacks: Optional[list[Callable[[TrainJob], None]]] = None) -> TrainJob:
        """Polls until the job's status is one of ``status`` and returns the job.

        Raises:
            ValueError: ``timeout`` is not positive, ``polling_interval`` is not positive and less than
                ``timeout``, or ``status`` is not a subset of {Created, Running, Complete, Failed} (in
                upstream's order), or is empty (a wait that could not end; upstream times out).
            RuntimeError: the job Failed while Failed was not awaited.
            TimeoutError: ``timeout`` seconds passed.
        """
        if isinstance(status, str):  # a single status, as a convenience
            status = {status}
        callback = None
        if callbacks:
            def callback(job_dict):
                job = _job_from_dict(job_dict)
                for cb in callbacks:
                    cb(job)
        return _job_from_dict(self._client.wait_for_job_status(name, sorted(status), float(timeout),
                                                               float(polling_interval), callback))

    def get_job_events(self, name: str) -> list[Event]:
        """The cluster's events about the job, its JobSet, Jobs and pods, oldest first (Kubernetes
        backend; upstream's filter, plus the JobSet's Jobs). NotImplementedError on the local backend,
        as upstream's local backends (its logs and ``get_job(name).steps`` say what happened)."""
        return [Event(involved_object_kind=e["involved_object_kind"], involved_object_name=e["involved_object_name"],
                      message=e["message"], reason=e["reason"], event_time=_timestamp(e["event_time"]))
                for e in self._client.get_job_events(name)]

    def export_job(self, name: str, destination: str, *, parts: str = "available", epoch: Optional[int] = None,
                   hf_token: Optional[str] = None, hf_endpoint: Optional[str] = None, repo_type: Optional[str] = None,
                   revision: Optional[str] = None, s3_endpoint: Optional[str] = None, s3_region: Optional[str] = None,
                   aws_access_key_id: Optional[str] = None, aws_secret_access_key: Optional[str] = None,
                   aws_session_token: Optional[str] = None, role_arn: Optional[str] = None,
                   aws_profile: Optional[str] = None, timeout: float = 3600,
                   log: Optional[Callable[[str], None]] = print) -> dict:
        """Ships a Complete job's outputs (ktune; upstream has no exporter): the adapter and/or merged
        model of its latest checkpoint (``epoch_N``, or a later mid-epoch ``step_N``; ``epoch`` picks
        ``epoch_N``) to ``file://DIR``, ``s3://bucket/prefix`` or ``hf://org/repo[/path]``, as a
        folder transformers, PEFT and vLLM load. ``parts``: ``"adapter"``, ``"merged"``, ``"all"`` or
        ``"available"`` (what the checkpoint holds). Credentials and endpoints not given come from
        the environment (``HF_TOKEN``, ``AWS_*``) and then the AWS profile in ``~/.aws``
        (``aws_profile``, else ``AWS_PROFILE``, else default); ``role_arn`` is assumed through STS. The local backend exports from this process (a Ctrl-C ends it mid-file,
        the export recorded as failed); on Kubernetes the exporter runs as a Job beside the
        TrainJob's volume (``timeout`` seconds at most). The export is recorded with the job
        (``ktune jobs get NAME``); each line of the exporter's log goes to ``log``.

        Returns the exporter's summary: ``destination``, ``checkpoint``, ``epoch``, ``parts``,
        ``files`` ([{path, bytes}]), ``bytes`` and, for hf://, the commit ``revision``.

        Raises:
            ValueError: an unknown ``parts`` or a malformed destination.
            RuntimeError: the job is not Complete, or the export failed (the record says why).
            TimeoutError: a cluster's export still runs after ``timeout`` seconds.
        """
        storage = {k: str(v) for k, v in dict(
            hf_token=hf_token, hf_endpoint=hf_endpoint, repo_type=repo_type, revision=revision,
            s3_endpoint=s3_endpoint, s3_region=s3_region, aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key, aws_session_token=aws_session_token,
            role_arn=role_arn, aws_profile=aws_profile).items() if v is not None}
        record = self._client.export_job(name, destination, parts, -1 if epoch is None else int(epoch), storage,
                                         float(timeout), log)
        if record["status"] != constants.TRAINJOB_COMPLETE:
            raise TimeoutError(f"the export of TrainJob {name} still runs after {timeout} s; "
                               f"`ktune jobs get {name}` shows its end")
        return json.loads(record["summary_json"] or "{}")

    def delete_job(self, name: str, *, remove_workspace: bool = False):
        """Stops the job's processes and forgets it; with ``remove_workspace`` (ktune, local backend)
        its files go too. On Kubernetes the TrainJob is deleted, and its volume goes with it as the
        runtime's claim policy says (``remove_workspace`` changes nothing there)."""
        self._client.delete_job(name, remove_workspace)
