"""Tasks: what a swarm trains (model, data, loss, per-step batch), as plugins looked up by name.

A task is a subclass of :class:`Task` registered under the ``swarmhub.tasks`` entry-point group
(the built-in ones are also registered here, so a source checkout works without package metadata).
The server validates an experiment's ``task_params`` with the task's ``Params`` model; the worker
builds the model and data from them. Workers never download code: a task must be installed locally.
The corpus tasks read is :mod:`.data` (with the checked file writes of :mod:`.safe_paths`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from importlib import import_module
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from swarmhub.common.proposal import DEFAULT_PLANNED_PEERS, SettingsProposal, propose
from swarmhub.common.protocol import OptimizerName

if TYPE_CHECKING:
    import torch

ENTRY_POINT_GROUP = "swarmhub.tasks"
_BUILTIN = {
    "digits": "swarmhub.worker.tasks.digits:DigitsTask",
    "albert-mlm": "swarmhub.worker.tasks.albert:AlbertMLMTask",
    "swav": "swarmhub.worker.tasks.swav:SwAVTask",
}


class UnknownTask(LookupError):
    pass


class CorpusNotAttached(RuntimeError):
    """A task that trains on the experiment's corpus was used before ``attach`` gave it one."""


class TaskData(Protocol):
    """An experiment's prepared corpus (``swarmhub.server.corpus.text`` or ``.images``), as a task reads it.

    For text, ``manifest`` is the corpus's ``manifest.json``: ``vocab_size``, ``seq_length``, ``special_tokens``
    (name -> id: pad, unk, cls, sep, mask), ``files`` (name -> sha256/bytes: the tokenizer's files and
    ``eval.npy``), ``shards`` (a list of ``{"name", "sha256", "sequences"}``). Every ``.npy`` is an int32 array of
    shape (sequences, seq_length): ``[CLS] tokens... [SEP]`` then ``[PAD]``s (``data.load_sequences``).

    For images (``"kind": "images"``): ``image_size`` S, ``images`` (training images), ``classes`` (label names,
    maybe none), ``files`` (``eval.npy``, ``eval_labels.npy``, ``bank.npy``, ``bank_labels.npy``, only where the
    organizer gave labels), ``shards`` (``{"name", "sha256", "images"}``). Images are uint8 (n, 3, S, S)
    (``data.load_images``), labels int64 (n,) indices into ``classes`` (``data.load_labels``); the ``eval`` images
    are in no shard, the ``bank`` images are in the shards too.

    A worker downloads what it reads (once, checked against the sha256, cached); the server's own peers read the
    files in place.
    """

    @property
    def manifest(self) -> dict[str, Any]: ...

    def file(self, name: str) -> Path:
        """The local path of one of ``manifest["files"]`` (for example ``tokenizer.json`` or ``eval.npy``)."""
        ...

    def shards(self, seed: int) -> Iterator[Path]:
        """Endless: local paths of the training shards this worker takes, one after another. The server hands
        shards out in turn, so the swarm covers the corpus before any shard repeats."""
        ...


class Evaluation(BaseModel):
    """A model measured on the task's held-out set: ``loss`` (the training loss's measure, for example nats of
    cross-entropy) and, for a task that predicts classes or tokens, the share of held-out labels it ranks first
    (``top1``) or among its five most likely (``top5``)."""

    loss: float
    top1: float | None = None
    top5: float | None = None


class Baseline(BaseModel):
    """What a model that knows only how often each label occurs scores: the loss (``cross_entropy``, in nats) and
    the accuracy (``top1``, ``top5``) a trained model must beat, measured on ``labels`` samples."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cross_entropy: float = Field(ge=0.0)
    top1: float = Field(ge=0.0, le=1.0)
    top5: float | None = Field(default=None, ge=0.0, le=1.0)
    labels: int = Field(ge=0, description="How many labels it was measured on")


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

    def extra_tensors(self, model: torch.nn.Module) -> list[torch.Tensor]:
        """What the swarm's state carries beside the parameters (hivemind's ``extra_tensors``: a peer that joins or
        the checkpoint peer downloads them): the model's floating-point buffers, such as batch norm's running
        statistics, without which a downloaded model evaluates with its initial ones."""
        return [buffer for buffer in model.buffers() if buffer.is_floating_point()]

    def parameter_groups(self, model: torch.nn.Module) -> Iterable[Any]:
        """What the optimizer trains; override for per-group settings (for example no weight decay on norms)."""
        return model.parameters()

    # A task that trains on a corpus the organizer gives the server sets this; the server then refuses to start
    # its experiment without one, and the worker calls ``attach`` with the corpus before anything else.
    needs_corpus: ClassVar[bool] = False
    # What kind of corpus such a task trains on: "text" (``swarmhub.server.corpus.text``: a tokenizer and token
    # shards) or "images" (``swarmhub.server.corpus.images``: uint8 image shards, labels for a held-out part). The
    # server takes only that kind for its experiments (an archive for a text task is refused, and text for an
    # image task) and offers only built-in sources of that kind.
    corpus_kind: ClassVar[Literal["text", "images"]] = "text"
    # The server runs a checkpoint peer for a task that sets this: it saves the swarm's model (``export``) with
    # its held-out loss (``evaluate``) at the organizer's interval, and an emptied swarm resumes from it.
    keeps_checkpoints: ClassVar[bool] = False
    data: TaskData | None = None

    def attach(self, data: TaskData) -> None:
        self.data = data

    # The timings a task proposes (``proposal``): how long peers look for an averaging group, and when a stuck
    # round is given up. hivemind's defaults; a task whose rounds move large vectors over slow links sets more.
    proposed_matchmaking_time: ClassVar[float] = 3.0
    proposed_averaging_timeout: ClassVar[float] = 30.0
    # The smallest target batch size the task proposes, whatever the reference rate (a batch its optimizer is
    # known to train well at, where peers are expected to be much faster than the reference).
    proposed_min_target_batch_size: ClassVar[int] = 1

    # The optimizer a task trains well with, proposed with a learning rate for the proposal's target batch size
    # (``proposed_learning_rate``); None leaves both to the experiment's defaults.
    proposed_optimizer: ClassVar[OptimizerName | None] = None

    def proposed_learning_rate(self, target_batch_size: int) -> float | None:
        """The learning rate ``proposed_optimizer`` trains this task well at with ``target_batch_size`` samples per
        step; None where the task proposes none."""
        return None

    def reference_samples_per_second(self) -> float | None:
        """What one reference peer trains a second with these parameters: one CPU thread of the machine
        ``bench/task_rates.py`` measured (a bare PyTorch loop: forward, backward, optimizer step), estimated from the
        task's cost model. None where the task has no estimate (its experiments then start from the plain defaults)."""
        return None

    def proposal(self, planned_peers: int = DEFAULT_PLANNED_PEERS) -> SettingsProposal | None:
        """Settings under which a swarm of ``planned_peers`` reference peers is bound by compute, not by the
        epoch-length guard (``swarmhub.common.proposal.swarm_rate_cap``), with the optimizer and learning rate the
        task trains well with at that target batch size where it proposes them; None without a reference rate."""
        rate = self.reference_samples_per_second()
        if rate is None:
            return None
        proposal = propose(
            rate,
            matchmaking_time=self.proposed_matchmaking_time,
            averaging_timeout=self.proposed_averaging_timeout,
            planned_peers=planned_peers,
            at_least=self.proposed_min_target_batch_size,
        )
        if self.proposed_optimizer is None:
            return proposal
        learning_rate = self.proposed_learning_rate(proposal.target_batch_size)
        return proposal.model_copy(update={"optimizer": self.proposed_optimizer, "learning_rate": learning_rate})

    def lr_schedule(self) -> Callable[[int], float] | None:
        """A learning-rate multiplier per collaborative step (the swarm's epoch), or None for a constant rate.
        hivemind steps the schedule once per epoch and sets it from the epoch on loading the swarm's state, so
        every peer agrees on the rate."""
        return None

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> float | None:
        """The held-out loss of ``model`` (the same samples every call), or None where the task has none."""
        return None

    def measure(self, model: torch.nn.Module, device: torch.device) -> Evaluation | None:
        """``evaluate``'s loss with the held-out accuracy where the task has one (what the checkpoint peer
        records); by default the loss alone."""
        loss = self.evaluate(model, device)
        return None if loss is None else Evaluation(loss=loss)

    # The dashboard's words for the baseline's reference line: what the baseline model knows.
    baseline_label: ClassVar[str] = ""
    # The dashboard's words for the checkpoints' measures (a task that keeps checkpoints): what the held-out set is,
    # what its accuracy counts, and how a user loads the downloaded model (plain text).
    held_out_words: ClassVar[str] = "samples no worker trains on"
    accuracy_words: ClassVar[str] = (
        "the share of the held-out labels the newest checkpoint ranks first, or among its five most likely"
    )
    download_words: ClassVar[str] = "the model's state dict (model.pt): load it with torch.load"

    def baseline(self, shard_paths: Iterable[Path] = ()) -> Baseline | None:
        """What a model that knows only the labels' frequencies scores, on the samples the dashboard's loss is
        measured on (``shard_paths``: the training shards, for a task that trains on a corpus), or None."""
        return None

    def export(self, model: torch.nn.Module, folder: Path) -> None:
        """Write ``model`` to ``folder`` in the format users load it in (for example a transformers model)."""
        import torch

        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), folder / "model.pt")


def _load(target: str) -> type[Task]:
    module_name, _, attr = target.partition(":")
    return getattr(import_module(module_name), attr)


@cache
def _installed() -> tuple[tuple[str, str], ...]:
    # Reading the entry points scans every installed package's metadata (milliseconds; the server asks on every
    # dashboard snapshot), so a process reads them once: a plugin installed later is seen after a restart.
    return tuple((ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP))


def available_tasks() -> dict[str, str]:
    """Task name to import target, built-ins first, then the plugins installed when the process first asked."""
    found = dict(_BUILTIN)
    for name, target in _installed():
        found.setdefault(name, target)
    return found


def get_task(name: str) -> type[Task]:
    targets = available_tasks()
    if name not in targets:
        known = ", ".join(sorted(targets))
        raise UnknownTask(f"unknown task {name!r}; installed tasks: {known}")
    return _load(targets[name])
