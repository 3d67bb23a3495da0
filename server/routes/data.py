"""Training data and models under /api: the organizer gives an experiment its text or images; workers download
the files and the shards the server hands out; anyone downloads the latest model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from pydantic import Field
from starlette.datastructures import UploadFile as StarletteUploadFile

from swarmhub.common.protocol import ShardTurn
from swarmhub.server import experiments
from swarmhub.server.accounts import quotas
from swarmhub.server.core.errors import BadRequest, documented
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import image_data, training_data
from swarmhub.server.experiments import rollback
from swarmhub.server.http.deps import DB, AppSettings, CurrentUser, OptionalUser, OrganizerUser, reconcile_after_commit
from swarmhub.server.http.ratelimit import limited
from swarmhub.server.models import User
from swarmhub.worker.tasks import UnknownTask, get_task

router = APIRouter(prefix="/api", tags=["data"], responses=documented(400, 401, 403, 404, 409, 413, 429))
# Multipart framing and the form's other fields: an upload's body may be this much over SWARMHUB_CORPUS_MAX_MB (or
# SWARMHUB_CORPUS_IMAGES_MAX_MB for an experiment that trains on images).
# ``body_limit.BodyLimit`` refuses a larger body (413) before it is read: the form would otherwise be parsed, and
# spooled to disk, whole.
UPLOAD_OVERHEAD = 64 * 1024
# An experiment's corpus as the API shows it: text or images, by its task ("kind").
AnyCorpusPublic = Annotated[training_data.CorpusPublic | image_data.ImageCorpusPublic, Field(discriminator="kind")]


def _printable(name: str) -> str:
    """A file name as the page shows it: no control characters (PostgreSQL text cannot hold a NUL), bounded."""
    return "".join(c if c.isprintable() else "?" for c in name)[:200]


async def set_corpus_from_form(
    session: DB,
    settings: AppSettings,
    experiment: experiments.Experiment,
    user: User,
    upload: StarletteUploadFile | None,
    source: str | None,
    options: training_data.CorpusOptions,
    image_options: image_data.ImageOptions,
) -> training_data.Corpus:
    """Shared by the API and the page: the uploaded file, or a corpus the server can read, prepared as the kind of
    corpus the experiment's task trains on (text with ``options``, images with ``image_options``)."""
    has_file = upload is not None and bool(upload.filename)
    if has_file and source:
        raise BadRequest("give a file or a source, not both", field="source")
    if training_data.corpus_kind(experiment) == "images":
        if upload is not None and has_file:
            # The archive stays in the file Starlette spooled it to: it is read member by member from there.
            label = _printable(upload.filename or "")
            return await run_in_threadpool(
                image_data.attach_archive, session, settings, experiment, user, upload.file, label, image_options
            )
        if source:
            return await run_in_threadpool(
                image_data.attach_source, session, settings, experiment, user, source, image_options
            )
        raise BadRequest("choose an archive of images to upload or an image set the server offers", field="file")
    if upload is not None and has_file:
        data = await upload.read(training_data.max_bytes(settings) + 1)
        text = await run_in_threadpool(training_data.read_upload, data, settings, upload.filename or "")
        label = f"upload:{_printable(upload.filename or '')}"
    elif source:
        text = await run_in_threadpool(training_data.read_source, settings, source)
        label = source
    else:
        raise BadRequest("choose a file to upload or a text the server offers", field="file")
    await run_in_threadpool(quotas.check_corpus, session, settings, experiment, user, text)
    return await run_in_threadpool(training_data.attach, session, settings, experiment, text, label, options)


def max_upload_bytes(settings: Settings, experiment: experiments.Experiment) -> int:
    """The largest file the experiment takes: an archive of images for a task that trains on images, else text."""
    if training_data.corpus_kind(experiment) == "images":
        return image_data.max_bytes(settings)
    return training_data.max_bytes(settings)


def corpus_view(session: DB, experiment: experiments.Experiment) -> AnyCorpusPublic | None:
    """The experiment's corpus as the API shows it, None before it has one (for its page)."""
    row = session.get(training_data.Corpus, experiment.id)
    return to_public(row, experiment) if row is not None else None


def to_public(row: training_data.Corpus, experiment: experiments.Experiment) -> AnyCorpusPublic:
    if training_data.corpus_kind(experiment) == "images":
        return image_data.to_public(row)
    return training_data.to_public(row)


@router.get("/corpus-sources", response_model=list[training_data.CorpusSource])
def corpus_sources(
    settings: AppSettings,
    user: CurrentUser,
    task: Annotated[
        str | None, Query(max_length=100, description="The experiment's task: only what it trains on is listed")
    ] = None,
) -> list[training_data.CorpusSource]:
    """What this server can give an experiment without an upload: texts, or with `task` of a task that trains on
    images, image sets."""
    kind: training_data.CorpusKind = "text"
    if task is not None:
        try:
            kind = get_task(task).corpus_kind
        except UnknownTask as exc:
            raise BadRequest(str(exc), field="task") from None
    return training_data.sources(settings, kind)


@router.put(
    "/experiments/{slug}/corpus",
    response_model=AnyCorpusPublic,
    dependencies=[limited("corpus")],
)
async def put_corpus(
    slug: str,
    session: DB,
    settings: AppSettings,
    user: OrganizerUser,
    file: Annotated[
        UploadFile | None,
        File(description="Plain UTF-8 text; for a task that trains on images, a .zip or .tar(.gz) of images"),
    ] = None,
    source: Annotated[str | None, Form(max_length=300, description="A name from /api/corpus-sources")] = None,
    vocab_size: Annotated[int, Form(ge=100, le=128_000)] = 8000,
    seq_length: Annotated[int, Form(ge=16, le=4096)] = 128,
    image_size: Annotated[int, Form(ge=16, le=256, description="Images only: pixels of each side")] = 32,
) -> AnyCorpusPublic:
    """Give the experiment its training data (organizer; draft or paused). Text: the server trains a tokenizer on
    it and cuts it into token shards. Images (a task whose corpus is images): the server checks the archive,
    decodes and resizes every image and cuts them into shards, holding out part of the labelled ones
    (docs/organizers.md). Answers once it is ready."""
    experiment = experiments.get_managed(session, slug, user)
    options = training_data.CorpusOptions(vocab_size=vocab_size, seq_length=seq_length)
    image_options = image_data.ImageOptions(image_size=image_size)
    row = await set_corpus_from_form(session, settings, experiment, user, file, source, options, image_options)
    return to_public(row, experiment)


@router.get("/experiments/{slug}/corpus", response_model=AnyCorpusPublic)
def get_corpus(slug: str, session: DB, user: OptionalUser) -> AnyCorpusPublic:
    experiment = experiments.get_visible(session, slug, user)
    return to_public(training_data.get(session, experiment), experiment)


def _joinable(session: DB, slug: str, user: CurrentUser) -> experiments.Experiment:
    experiment = experiments.get_visible(session, slug, user)
    experiments.check_joinable(session, experiment, user)
    return experiment


@router.get("/experiments/{slug}/data/manifest")
def data_manifest(slug: str, session: DB, settings: AppSettings, user: CurrentUser) -> dict:
    """The corpus's manifest (files and shards with their sha256) for the experiment's volunteers."""
    row = training_data.get(session, _joinable(session, slug, user))
    return training_data.manifest(settings, row)


@router.get("/experiments/{slug}/data/files/{name:path}", response_class=FileResponse)
def data_file(slug: str, name: str, session: DB, settings: AppSettings, user: CurrentUser) -> FileResponse:
    """One file of the manifest (the tokenizer, the held-out set, a shard)."""
    row = training_data.get(session, _joinable(session, slug, user))
    return FileResponse(training_data.file_path(settings, row, name), media_type="application/octet-stream")


@router.post("/experiments/{slug}/data/next-shard", response_model=ShardTurn)
def next_shard(slug: str, session: DB, user: CurrentUser) -> ShardTurn:
    """The next shard to train on: the server hands every shard out once before any twice."""
    return ShardTurn(index=training_data.next_shard(session, _joinable(session, slug, user)))


@router.get("/experiments/{slug}/checkpoints", response_model=list[training_data.CheckpointPublic])
def list_checkpoints(slug: str, session: DB, user: OptionalUser) -> list[training_data.CheckpointPublic]:
    """The models the server took from the swarm, with their held-out loss."""
    return training_data.checkpoints(session, experiments.get_visible(session, slug, user))


@router.post("/experiments/{slug}/rollback", response_model=rollback.RollbackAccepted, status_code=202)
def roll_back(
    slug: str, body: rollback.RollbackRequest, session: DB, user: OrganizerUser, request: Request
) -> rollback.RollbackAccepted:
    """Restore a kept checkpoint as the swarm's state (organizer only): the server's checkpoint peer shares it,
    and every peer loads it at its next read of the swarm's progress. 400 for a step with no kept checkpoint or a
    task that keeps none, 409 for an experiment that is neither running nor paused."""
    accepted = rollback.request(session, experiments.get_managed(session, slug, user), body.epoch)
    reconcile_after_commit(request, session)  # the reconcile reads the request
    return accepted


@router.get("/experiments/{slug}/model", response_class=FileResponse)
def download_model(slug: str, session: DB, settings: AppSettings, user: OptionalUser) -> FileResponse:
    """The latest model as a zip in the transformers format (weights, config, tokenizer)."""
    experiment = experiments.get_visible(session, slug, user)
    row, path = training_data.latest_model(session, settings, experiment)
    return FileResponse(path, media_type="application/zip", filename=f"{experiment.slug}-step{row.epoch}.zip")
