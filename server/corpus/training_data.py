"""An experiment's training data and models: the corpus the server prepares and serves to its workers (handing
the shards out in turn), and the checkpoints its checkpoint peer keeps.

A text corpus is attached here (``attach``), an image corpus by :mod:`.image_data`; both end in ``take_row``.
Files live under the data directory: ``corpora/<folder>`` (see ``text.prepare``, ``images.prepare``) and
``checkpoints/<run_id>/<epoch>`` (see ``checkpoint_peer``). Several server processes must share that directory
(one volume), as they share the database.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import event, select, update
from sqlalchemy.orm import Session

from swarmhub.common.protocol import ExperimentStatus
from swarmhub.server import experiments, metrics
from swarmhub.server.core.errors import BadRequest, Conflict, NotFound
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import text as corpus
from swarmhub.server.corpus.images import BUILTIN_IMAGE_SETS
from swarmhub.server.models import Checkpoint, Corpus, Experiment
from swarmhub.worker import tasks
from swarmhub.worker.tasks import UnknownTask, get_task
from swarmhub.worker.tasks.data import LocalCorpus

CorpusKind = Literal["text", "images"]
BUILTIN_PREFIX = "builtin:"
SERVER_PREFIX = "server:"


class CorpusPublic(BaseModel):
    kind: Literal["text"] = "text"
    source: str
    bytes: int
    vocab_size: int
    seq_length: int
    shards: int
    train_sequences: int
    eval_sequences: int
    created_at: datetime


class CorpusSource(BaseModel):
    """A corpus the server can read: a built-in text or image set, or a text file in the operator's
    ``SWARMHUB_CORPUS_DIR``."""

    name: str = Field(description="What to send as `source`")
    title: str


class CorpusOptions(BaseModel):
    """How the server prepares the text (the tokenizer's vocabulary and the sequence length)."""

    vocab_size: int = Field(default=8000, ge=100, le=128_000, description="Tokens in the trained vocabulary")
    seq_length: int = Field(default=128, ge=16, le=4096, description="Tokens per training sequence")


class CheckpointPublic(BaseModel):
    epoch: int = Field(description="The collaborative step the model was taken at")
    eval_loss: float | None = Field(description="Held-out loss of the model at that step")
    eval_top1: float | None = Field(
        default=None, description="Held-out accuracy: share of the masked tokens the model ranks first"
    )
    eval_top5: float | None = Field(
        default=None, description="Share of the held-out masked tokens among the model's five most likely"
    )
    created_at: datetime
    downloadable: bool = Field(description="Its files are still kept (the newest few are)")
    restored_from: int | None = Field(
        default=None, description="The step of the checkpoint an organizer rolled the swarm back to (its first)"
    )


def corpora_dir(settings: Settings) -> Path:
    return settings.data_dir / "corpora"


def checkpoints_dir(settings: Settings) -> Path:
    return settings.data_dir / "checkpoints"


def corpus_folder(settings: Settings, row: Corpus) -> Path:
    return corpora_dir(settings) / row.folder


def to_public(row: Corpus) -> CorpusPublic:
    return CorpusPublic(
        source=row.source,
        bytes=row.bytes,
        vocab_size=row.vocab_size,
        seq_length=row.seq_length,
        shards=row.shards,
        train_sequences=row.train_sequences,
        eval_sequences=row.eval_sequences,
        created_at=row.created_at,
    )


def _server_files(settings: Settings) -> list[Path]:
    folder = settings.corpus_dir
    if folder is None or not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix == ".txt" and not p.name.startswith("."))


def corpus_kind(experiment: Experiment) -> CorpusKind:
    """What the experiment's task trains on: "text" or "images" (a task not installed here: "text")."""
    try:
        return get_task(experiment.task).corpus_kind
    except UnknownTask:
        return "text"


def sources(settings: Settings, kind: CorpusKind = "text") -> list[CorpusSource]:
    """What the server offers an experiment whose task trains on ``kind``, to give it without an upload."""
    if kind == "images":
        return [CorpusSource(name=BUILTIN_PREFIX + name, title=title) for name, title in BUILTIN_IMAGE_SETS.items()]
    found = [CorpusSource(name=BUILTIN_PREFIX + name, title=title) for name, title in corpus.BUILTIN_CORPORA.items()]
    for path in _server_files(settings):
        found.append(CorpusSource(name=SERVER_PREFIX + path.name, title=f"{path.name} (on the server)"))
    return found


def max_bytes(settings: Settings) -> int:
    return int(settings.corpus_max_mb * 1024 * 1024)


def read_source(settings: Settings, name: str) -> str:
    """The text of a corpus the server can read, by its ``sources`` name."""
    if name.startswith(BUILTIN_PREFIX) and name[len(BUILTIN_PREFIX) :] in corpus.BUILTIN_CORPORA:
        return corpus.builtin_text(name[len(BUILTIN_PREFIX) :])
    if name.startswith(SERVER_PREFIX):
        # Only a name from the folder's own listing: a path from a request never reaches the file system.
        wanted = name[len(SERVER_PREFIX) :]
        for path in _server_files(settings):
            if path.name == wanted:
                limit = max_bytes(settings)
                with open(path, "rb") as handle:
                    data = handle.read(limit + 1)
                return _read(data, limit, path.name)
    known = ", ".join(s.name for s in sources(settings))
    raise BadRequest(f"no corpus {name!r} on this server; it offers: {known}", field="source")


def read_upload(data: bytes, settings: Settings, filename: str) -> str:
    return _read(data, max_bytes(settings), filename)


def _read(data: bytes, limit: int, filename: str) -> str:
    try:
        return corpus.read_upload(data, max_bytes=limit, filename=filename)
    except corpus.CorpusError as exc:
        raise BadRequest(str(exc), field=exc.field or "file") from None


def check_editable(session: Session, experiment: Experiment) -> None:
    if not experiments.needs_corpus(experiment):
        raise BadRequest(f"the task {experiment.task!r} trains on no corpus", field="source")
    if experiment.status not in (ExperimentStatus.draft, ExperimentStatus.paused):
        raise Conflict(
            f"the experiment is {experiment.status}: pause it before changing its training text", field="source"
        )
    if session.scalar(select(Checkpoint.id).where(Checkpoint.experiment_id == experiment.id).limit(1)) is not None:
        raise Conflict(
            "this experiment's model was trained with the current text's tokenizer: create a new experiment to "
            "train on other text",
            field="source",
        )


def attach(
    session: Session, settings: Settings, experiment: Experiment, text: str, source: str, options: CorpusOptions
) -> Corpus:
    """Prepare ``text`` (tokenizer, shards) and make it the experiment's corpus. Nothing is half made: the
    folder appears whole or not at all, and the one it replaces is removed only once the change is committed."""
    check_editable(session, experiment)
    name, folder = new_folder(settings, experiment)
    try:
        manifest = corpus.prepare(
            text, folder, vocab_size=options.vocab_size, seq_length=options.seq_length, source=source
        )
    except corpus.CorpusError as exc:
        raise BadRequest(str(exc), field=exc.field or "file") from None
    row = take_row(session, settings, experiment, name, manifest)
    row.source = source[:300]
    row.bytes = manifest["bytes"]
    row.text_sha256 = manifest["text_sha256"]
    row.vocab_size = manifest["vocab_size"]
    row.seq_length = manifest["seq_length"]
    row.train_sequences = manifest["train_sequences"]
    row.eval_sequences = manifest["eval_sequences"]
    session.flush()
    return row


def new_folder(settings: Settings, experiment: Experiment) -> tuple[str, Path]:
    """A fresh name for an experiment's corpus folder under ``corpora/``, and its path (not created)."""
    name = f"{experiment.id}-{uuid.uuid4().hex[:12]}"
    folder = corpora_dir(settings) / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    return name, folder


def take_row(
    session: Session, settings: Settings, experiment: Experiment, name: str, manifest: dict[str, Any]
) -> Corpus:
    """Make the prepared folder ``corpora/<name>`` the experiment's corpus: its row (the caller sets what the kind
    of corpus records, then flushes), shards handed out from the first again, the task's baseline measured on it;
    the folder it replaces is removed once the change is committed, the new one if it is rolled back."""
    folder = corpora_dir(settings) / name
    row = session.get(Corpus, experiment.id)
    old = corpus_folder(settings, row) if row is not None else None
    _after_transaction(session, remove_on_commit=old, remove_on_rollback=folder)
    if row is None:
        row = Corpus(experiment_id=experiment.id)
        session.add(row)
    row.folder = name
    row.shards = len(manifest["shards"])
    row.next_shard = 0
    found = measure_baseline(experiment, folder, manifest)
    row.baseline_loss = found.cross_entropy if found is not None else None
    row.baseline_top1 = found.top1 if found is not None else None
    row.baseline_top5 = found.top5 if found is not None else None
    return row


def measure_baseline(experiment: Experiment, folder: Path, manifest: dict[str, Any]) -> tasks.Baseline | None:
    """The experiment's task's baseline on a freshly prepared corpus (every training shard read once: seconds for
    the largest corpus the server takes), or None for a task without one."""
    task = get_task(experiment.task)(experiment.task_params)
    task.attach(LocalCorpus(folder))
    return task.baseline([folder / shard["name"] for shard in manifest["shards"]])


def baseline(session: Session, experiment: Experiment) -> metrics.Baseline | None:
    """The reference line of the experiment's loss chart: the corpus's stored baseline for a task that keeps
    checkpoints (measured on the held-out set), the task's own for one without a corpus; None otherwise."""
    try:
        task = get_task(experiment.task)
    except UnknownTask:
        return None
    if task.needs_corpus:
        row = session.get(Corpus, experiment.id)
        if row is None or row.baseline_loss is None:
            return None
        return metrics.Baseline(
            label=task.baseline_label,
            measured_on="held-out" if task.keeps_checkpoints else "training",
            loss=row.baseline_loss,
            top1=row.baseline_top1,
            top5=row.baseline_top5,
        )
    found = _corpus_free_baseline(experiment.task)
    if found is None:
        return None
    return metrics.Baseline(
        label=task.baseline_label, measured_on="training", loss=found.cross_entropy, top1=found.top1, top5=found.top5
    )


@functools.cache
def _corpus_free_baseline(task_name: str) -> tasks.Baseline | None:
    # A task without a corpus measures its baseline on data it ships, the same for every experiment: once a process.
    return get_task(task_name)().baseline()


def _after_transaction(session: Session, *, remove_on_commit: Path | None, remove_on_rollback: Path) -> None:
    def committed(_: Session) -> None:
        with contextlib.suppress(Exception):
            event.remove(session, "after_soft_rollback", rolled_back)
        if remove_on_commit is not None:
            shutil.rmtree(remove_on_commit, ignore_errors=True)

    def rolled_back(_: Session, previous: Any) -> None:
        with contextlib.suppress(Exception):
            event.remove(session, "after_commit", committed)
        shutil.rmtree(remove_on_rollback, ignore_errors=True)

    event.listen(session, "after_commit", committed, once=True)
    event.listen(session, "after_soft_rollback", rolled_back, once=True)


def get(session: Session, experiment: Experiment) -> Corpus:
    row = session.get(Corpus, experiment.id)
    if row is None:
        raise NotFound(f"experiment {experiment.slug!r} has no training text yet", field="source")
    return row


def next_shard(session: Session, experiment: Experiment) -> int:
    """The next shard in the swarm's turn: every shard is handed out once before any is handed out again."""
    taken = session.execute(
        update(Corpus)
        .where(Corpus.experiment_id == experiment.id)
        .values(next_shard=Corpus.next_shard + 1)
        .returning(Corpus.next_shard, Corpus.shards)
    ).one_or_none()
    if taken is None:
        raise NotFound(f"experiment {experiment.slug!r} has no training text yet", field="source")
    counter, shards = taken
    return int((counter - 1) % max(shards, 1))


def manifest(settings: Settings, row: Corpus) -> dict[str, Any]:
    return corpus.load_manifest(corpus_folder(settings, row))


def file_path(settings: Settings, row: Corpus, name: str) -> Path:
    try:
        return corpus.file_path(corpus_folder(settings, row), name)
    except corpus.CorpusError as exc:
        raise NotFound(str(exc), field="name") from None


# Checkpoints


def record_checkpoint(
    session: Session,
    settings: Settings,
    experiment: Experiment,
    epoch: int,
    eval_loss: float | None,
    folder: str,
    restored_from: int | None = None,
    *,
    eval_top1: float | None = None,
    eval_top5: float | None = None,
) -> Checkpoint:
    """Remember a checkpoint the checkpoint peer finished (its held-out loss and accuracy), and prune the files of
    all but the newest few."""
    row = session.scalar(select(Checkpoint).where(Checkpoint.experiment_id == experiment.id, Checkpoint.epoch == epoch))
    if row is None:
        row = Checkpoint(experiment_id=experiment.id, epoch=epoch)
        session.add(row)
    row.eval_loss = eval_loss
    row.eval_top1 = eval_top1
    row.eval_top5 = eval_top5
    row.folder = folder
    row.restored_from = restored_from
    row.kept = True
    session.flush()
    kept = session.scalars(
        select(Checkpoint)
        .where(Checkpoint.experiment_id == experiment.id, Checkpoint.kept.is_(True))
        .order_by(Checkpoint.epoch.desc())
    ).all()
    for old in kept[settings.checkpoints_kept :]:
        shutil.rmtree(checkpoints_dir(settings) / old.folder, ignore_errors=True)
        old.kept = False
    session.flush()
    return row


def checkpoints(session: Session, experiment: Experiment, limit: int = 500) -> list[CheckpointPublic]:
    rows = session.scalars(
        select(Checkpoint)
        .where(Checkpoint.experiment_id == experiment.id)
        .order_by(Checkpoint.epoch.desc())
        .limit(limit)
    ).all()
    return [
        CheckpointPublic(
            epoch=r.epoch,
            eval_loss=r.eval_loss,
            eval_top1=r.eval_top1,
            eval_top5=r.eval_top5,
            created_at=r.created_at,
            downloadable=r.kept,
            restored_from=r.restored_from,
        )
        for r in reversed(rows)
    ]


def latest_model(session: Session, settings: Settings, experiment: Experiment) -> tuple[Checkpoint, Path]:
    row = session.scalar(
        select(Checkpoint)
        .where(Checkpoint.experiment_id == experiment.id, Checkpoint.kept.is_(True))
        .order_by(Checkpoint.epoch.desc())
        .limit(1)
    )
    path = checkpoints_dir(settings) / row.folder / "model.zip" if row is not None else None
    if row is None or path is None or not path.is_file():
        raise NotFound(f"experiment {experiment.slug!r} has no saved model yet")
    return row, path
