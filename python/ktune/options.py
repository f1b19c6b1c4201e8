"""Upstream's ``train(options=[...])`` (``kubeflow.trainer.options``) that ktune takes.

``Name`` works with every backend; ``Labels``, ``Annotations`` and ``ActiveDeadlineSeconds`` set the
TrainJob's metadata and spec, and ``TrainerCommand`` / ``TrainerArgs`` its trainer's command and
arguments (with a ``CustomTrainerContainer`` or no trainer, as upstream), so only the Kubernetes
backend takes them (the local backend refuses them at ``train()``, as upstream's options refuse every
backend but Kubernetes; ``plan()`` renders them). Upstream's own option objects work too: the client
reads them by class name and fields. The patch options (``RuntimePatch``, ``PodSpecPatch``, ...) are
refused by name: ktune's TrainJobs are built by its control plane, which has no patch layer.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ActiveDeadlineSeconds", "Annotations", "Labels", "Name", "TrainerArgs", "TrainerCommand"]


@dataclass
class Name:
    """The TrainJob's name (an RFC 1035 label). Every backend."""

    name: str


@dataclass
class Labels:
    """Labels of the TrainJob (``.metadata.labels``). Kubernetes backend only."""

    labels: dict[str, str]


@dataclass
class Annotations:
    """Annotations of the TrainJob (``.metadata.annotations``). Kubernetes backend only."""

    annotations: dict[str, str]


@dataclass
class ActiveDeadlineSeconds:
    """``.spec.activeDeadlineSeconds``: seconds from creation before the TrainJob is stopped and
    marked Failed (DeadlineExceeded). Kubernetes backend only."""

    seconds: int

    def __post_init__(self):
        if type(self.seconds) is not int or self.seconds < 1:
            raise ValueError("activeDeadlineSeconds must be a positive integer (minimum 1)")


@dataclass
class TrainerCommand:
    """Replaces the trainer container's command (``.spec.trainer.command``). Only with a
    ``CustomTrainerContainer`` (or no trainer); Kubernetes backend only."""

    command: list[str]


@dataclass
class TrainerArgs:
    """Replaces the trainer container's arguments (``.spec.trainer.args``). Only with a
    ``CustomTrainerContainer`` (or no trainer); Kubernetes backend only."""

    args: list[str]
