"""Training data and models under /api: the organizer gives an experiment its text; workers download the
tokenizer and the shards the server hands out; anyone downloads the latest model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from starlette.datastructures import UploadFile as StarletteUploadFile

from swarmhub.common.protocol import ShardTurn
from swarmhub.server import experiments
from swarmhub.server.accounts import quotas
from swarmhub.server.core.errors import BadRequest, documented
from swarmhub.server.corpus import training_data
from swarmhub.server.experiments import rollback
from swarmhub.server.http.deps import DB, AppSettings, CurrentUser, OptionalUser, OrganizerUser, reconcile_after_commit
from swarmhub.server.http.ratelimit import limited
from swarmhub.server.models import User

router = APIRouter(prefix="/api", tags=["data"], responses=documented(400, 401, 403, 404, 409, 413, 429))
# Multipart framing and the form's other fields: an upload's body may be this much over SWARMHUB_CORPUS_MAX_MB.
# ``body_limit.BodyLimit`` refuses a larger body (413) before it is read: the form would otherwise be parsed, and
# spooled to disk, whole.
UPLOAD_OVERHEAD = 64 * 1024


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
) -> training_data.Corpus:
    """Shared by the API and the page: the uploaded file, or a text the server can read, prepared."""
    if upload is not None and upload.filename:
        if source:
            raise BadRequest("give a file or a source, not both", field="source")
        data = await upload.read(training_data.max_bytes(settings) + 1)
        text = await run_in_threadpool(training_data.read_upload, data, settings, upload.filename)
        label = f"upload:{_printable(upload.filename)}"
    elif source:
        text = await run_in_threadpool(training_data.read_source, settings, source)
        label = source
    else:
        raise BadRequest("choose a file to upload or a text the server offers", field="file")
    await run_in_threadpool(quotas.check_corpus, session, settings, experiment, user, text)
    return await run_in_threadpool(training_data.attach, session, settings, experiment, text, label, options)


@router.get("/corpus-sources", response_model=list[training_data.CorpusSource])
def corpus_sources(settings: AppSettings, user: CurrentUser) -> list[training_data.CorpusSource]:
    """Texts this server can read, to give an experiment without uploading anything."""
    return training_data.sources(settings)


@router.put(
    "/experiments/{slug}/corpus",
    response_model=training_data.CorpusPublic,
    dependencies=[limited("corpus")],
)
async def put_corpus(
    slug: str,
    session: DB,
    settings: AppSettings,
    user: OrganizerUser,
    file: Annotated[UploadFile | None, File(description="Plain UTF-8 text")] = None,
    source: Annotated[str | None, Form(max_length=300, description="A name from /api/corpus-sources")] = None,
    vocab_size: Annotated[int, Form(ge=100, le=128_000)] = 8000,
    seq_length: Annotated[int, Form(ge=16, le=4096)] = 128,
) -> training_data.CorpusPublic:
    """Give the experiment its training text (organizer; draft or paused): the server trains a tokenizer on it and
    cuts it into token shards. Answers once it is ready."""
    experiment = experiments.get_managed(session, slug, user)
    options = training_data.CorpusOptions(vocab_size=vocab_size, seq_length=seq_length)
    row = await set_corpus_from_form(session, settings, experiment, user, file, source, options)
    return training_data.to_public(row)


@router.get("/experiments/{slug}/corpus", response_model=training_data.CorpusPublic)
def get_corpus(slug: str, session: DB, user: OptionalUser) -> training_data.CorpusPublic:
    experiment = experiments.get_visible(session, slug, user)
    return training_data.to_public(training_data.get(session, experiment))


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
