"""Tasks: what a swarm trains (model, data, loss, per-step batch), as plugins looked up by name.

A task is a subclass of :class:`Task` registered under the ``swarmhub.tasks`` entry-point group
(the built-in ones are also registered here, so a source checkout works without package metadata).
The server validates an experiment's ``task_params`` with the task's ``Params`` model; the worker
builds the model and data from them. Workers never download code: a task must be installed locally.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from importlib import import_module
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "swarmhub.tasks"
_BUILTIN = {"digits": "swarmhub.worker.tasks.digits:DigitsTask"}


class UnknownTask(LookupError):
    pass


class Task(ABC):
    """One trainable workload. Subclasses set ``name``, ``title`` and ``Params``."""

    name: ClassVar[str]
    title: ClassVar[str]
    Params: ClassVar[type[BaseModel]]

    def __init__(self, params: BaseModel | dict[str, Any] | None = None):
        self.params = params if isinstance(params, BaseModel) else self.Params.model_validate(params or {})

    @property
    @abstractmethod
    def batch_size(self) -> int:
        """Samples per local step (hivemind's ``batch_size_per_step``)."""

    @abstractmethod
    def build_model(self) -> torch.nn.Module:
        """A freshly initialised model. Peers load the swarm's state after building it."""

    @abstractmethod
    def batches(self, seed: int) -> Iterator[Any]:
        """An endless stream of training batches; ``seed`` differs per worker so peers see different data."""

    @abstractmethod
    def loss(self, model: torch.nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        """The scalar training loss of ``model`` on ``batch``."""

    def parameter_groups(self, model: torch.nn.Module) -> Iterable[Any]:
        """What the optimizer trains; override for per-group settings (for example no weight decay on norms)."""
        return model.parameters()


def _load(target: str) -> type[Task]:
    module_name, _, attr = target.partition(":")
    return getattr(import_module(module_name), attr)


def available_tasks() -> dict[str, str]:
    """Task name to import target, built-ins first, then installed plugins."""
    found = dict(_BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def get_task(name: str) -> type[Task]:
    targets = available_tasks()
    if name not in targets:
        known = ", ".join(sorted(targets))
        raise UnknownTask(f"unknown task {name!r}; installed tasks: {known}")
    return _load(targets[name])
