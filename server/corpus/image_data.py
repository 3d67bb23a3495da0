"""An experiment's images as its training data, for a task whose ``corpus_kind`` is "images".

The organizer uploads an archive (read from the file Starlette spooled it to, never whole: ``attach_archive``) or
picks a built-in image set (``attach_source``). :mod:`.images` prepares the folder; the experiment's ``Corpus`` row
records it as :mod:`.training_data` does for text, through ``training_data.take_row``, and the shards are handed out
and served by the same routes.

The row's columns were named for text; an image corpus fills them so: ``bytes`` the arrays' bytes (what the quota
counts), ``text_sha256`` the corpus's identity (the manifest's ``sha256``), ``seq_length`` the image size,
``vocab_size`` the number of classes, ``train_sequences`` the training images, ``eval_sequences`` the held-out ones.
``to_public`` names them for what they are.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from swarmhub.server.accounts import quotas
from swarmhub.server.core.errors import BadRequest
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import images, training_data
from swarmhub.server.corpus.upload import CorpusError, over_limit
from swarmhub.server.models import Corpus, Experiment, User

Prepare = Callable[[Path, Callable[[int], None]], dict[str, Any]]
IMAGE_WORDS = ("these images take", "fewer or smaller images")


class ImageOptions(BaseModel):
    """How the server prepares the images."""

    image_size: int = Field(default=32, ge=16, le=256, description="Pixels of each side of the stored images")


class ImageCorpusPublic(BaseModel):
    kind: Literal["images"] = "images"
    source: str
    bytes: int = Field(description="Bytes of the prepared image and label arrays")
    image_size: int = Field(description="Pixels of each side: images are stored as uint8 (n, 3, size, size)")
    images: int = Field(description="Training images")
    eval_images: int = Field(description="Labelled images held out to measure the backbone, in no training shard")
    classes: int = Field(description="Labels given (0 without labels)")
    shards: int
    created_at: datetime


def max_bytes(settings: Settings) -> int:
    return int(settings.corpus_images_max_mb * 1024 * 1024)


def kind_of(session: Session, slug: str) -> training_data.CorpusKind:
    """The kind of corpus the experiment ``slug`` takes, for the upload's size limit ("text" for no experiment:
    its upload is refused later)."""
    experiment = session.scalar(select(Experiment).where(Experiment.slug == slug))
    return training_data.corpus_kind(experiment) if experiment is not None else "text"


def to_public(row: Corpus) -> ImageCorpusPublic:
    return ImageCorpusPublic(
        source=row.source,
        bytes=row.bytes,
        image_size=row.seq_length,
        images=row.train_sequences,
        eval_images=row.eval_sequences,
        classes=row.vocab_size,
        shards=row.shards,
        created_at=row.created_at,
    )


def attach_archive(
    session: Session,
    settings: Settings,
    experiment: Experiment,
    user: User | None,
    file: IO[bytes],
    filename: str,
    options: ImageOptions,
) -> Corpus:
    """Prepare the archive in ``file`` (seekable; at most ``max_bytes``) as the experiment's images.
    ``filename`` is what the row's source records ("upload:NAME"), printable and bounded by the caller."""
    file.seek(0, 2)
    size = file.tell()
    if size > max_bytes(settings):
        have, most = over_limit(size, max_bytes(settings))
        raise BadRequest(
            f"The archive is {have}, larger than the limit of {most} (SWARMHUB_CORPUS_IMAGES_MAX_MB): upload a "
            "smaller one.",
            field="file",
        )
    source = f"upload:{filename}"

    def prepare(folder: Path, before_writing: Callable[[int], None]) -> dict[str, Any]:
        return images.prepare(file, folder, image_size=options.image_size, source=source, before_writing=before_writing)

    return _attach(session, settings, experiment, user, prepare, source)


def attach_source(
    session: Session, settings: Settings, experiment: Experiment, user: User | None, name: str, options: ImageOptions
) -> Corpus:
    """Prepare an image set the server offers (``training_data.sources(settings, "images")``) as the experiment's
    images: ``builtin:shapes`` (seconds)."""
    offered = {source.name for source in training_data.sources(settings, "images")}
    if name not in offered:
        raise BadRequest(
            f"no image set {name!r} on this server; it offers: {', '.join(sorted(offered))}", field="source"
        )
    builtin = name.removeprefix(training_data.BUILTIN_PREFIX)

    def prepare(folder: Path, before_writing: Callable[[int], None]) -> dict[str, Any]:
        return images.prepare_builtin(builtin, folder, image_size=options.image_size, before_writing=before_writing)

    return _attach(session, settings, experiment, user, prepare, name)


def _attach(
    session: Session,
    settings: Settings,
    experiment: Experiment,
    user: User | None,
    prepare: Prepare,
    source: str,
) -> Corpus:
    training_data.check_editable(session, experiment)
    name, folder = training_data.new_folder(settings, experiment)

    def check_quota(size: int) -> None:  # once the archive is read, before anything is decoded or written
        if user is not None:
            quotas.check_corpus_bytes(session, settings, experiment, user, size, IMAGE_WORDS)

    try:
        manifest = prepare(folder, check_quota)
    except CorpusError as exc:
        raise BadRequest(str(exc), field=exc.field or "file") from None
    row = training_data.take_row(session, settings, experiment, name, manifest)
    row.source = source[:300]
    row.bytes = manifest["bytes"]
    row.text_sha256 = manifest["sha256"]
    row.vocab_size = len(manifest["classes"])
    row.seq_length = manifest["image_size"]
    row.train_sequences = manifest["images"]
    row.eval_sequences = manifest["eval_images"]
    session.flush()
    return row
