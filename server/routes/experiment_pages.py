"""Experiment pages: the list of experiments, an experiment's form (new and edit), its dashboard and the
organizer's actions on it (training text, status, rollback, removals), and invite links. Forms post back here with
a CSRF token; services do the work."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from swarmhub.common.proposal import DEFAULT_PLANNED_PEERS, swarm_rate_cap, unthrottled_batch
from swarmhub.common.protocol import Aggregation, OptimizerName, Overlap, TrainingSettings
from swarmhub.server import experiments, teams
from swarmhub.server.accounts import quotas
from swarmhub.server.core.errors import AppError
from swarmhub.server.corpus import image_data, training_data
from swarmhub.server.corpus import upload as corpus_upload
from swarmhub.server.experiments import rollback
from swarmhub.server.http.deps import CSRF, DB, AppSettings, PageUser, RequiredPageUser, reconcile_after_commit
from swarmhub.server.http.ratelimit import limited
from swarmhub.server.http.views import render
from swarmhub.server.metrics import swarm_view
from swarmhub.server.routes import data
from swarmhub.server.routes.page_helpers import WebSess, form_errors, router, see_other
from swarmhub.server.routes.teams import After
from swarmhub.server.services import services
from swarmhub.worker.tasks import available_tasks, get_task

EXPERIMENT_FIELDS = (
    "title",
    "slug",
    "description",
    "task",
    "join_policy",
    "allowlist",
    "aux_peer",
    "checkpoint_minutes",
    "max_peers_per_volunteer",
    "auto_remove_flags",
    *[f for f in TrainingSettings.model_fields if f not in ("task", "task_params")],
)


def task_forms() -> list[dict[str, Any]]:
    """Every installed task with its parameter fields, rendered from the JSON schema of its ``Params``."""
    forms = []
    for name in available_tasks():
        task = get_task(name)
        schema = task.Params.model_json_schema()
        fields = []
        for field_name, prop in schema.get("properties", {}).items():
            kind = prop.get("type")
            choices = prop.get("enum")
            if choices is None and "const" in prop:
                choices = [prop["const"]]
            if choices is not None:
                widget = "select"
            elif kind == "boolean":
                widget = "checkbox"
            elif kind in ("integer", "number"):
                widget = "number"
            else:
                widget = "text"
            fields.append(
                {
                    "name": field_name,
                    "title": prop.get("title", field_name),
                    "default": prop.get("default"),
                    "help": prop.get("description", ""),
                    "widget": widget,
                    "choices": choices or [],
                    "step": "1" if kind == "integer" else "any",
                    "min": prop.get("minimum", prop.get("exclusiveMinimum")),
                    "max": prop.get("maximum", prop.get("exclusiveMaximum")),
                    "maxlength": prop.get("maxLength"),
                }
            )
        forms.append({"name": name, "title": task.title, "fields": fields, "needs_corpus": task.needs_corpus})
    return forms


async def _experiment_form(request: Request) -> tuple[dict[str, Any], dict[str, str]]:
    """The submitted experiment as a dict, and inline errors for its task parameters."""
    form = await request.form()
    data: dict[str, Any] = {name: str(form.get(name, "")) for name in EXPERIMENT_FIELDS if name in form}
    # Not an experiment's setting (it only sizes the proposal the page shows), but kept for a re-shown form.
    request.state.planned_peers = str(form.get("planned_peers", ""))[:8]
    task = data.get("task", "")
    params: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if task in available_tasks():
        prefix = f"param.{task}."
        params = {
            key[len(prefix) :]: str(value) for key, value in form.items() if key.startswith(prefix) and value != ""
        }
        try:
            get_task(task).Params.model_validate(params)
        except ValidationError as exc:
            errors.update(form_errors(exc, prefix=prefix))
    data["task_params"] = params
    return data, errors


def _form_page(
    request: Request,
    user: Any,
    web: Any,
    *,
    values: dict[str, Any],
    errors: dict[str, str],
    experiment: Any = None,
    fastest_peer_rate: float = 0.0,
    proposed: bool = False,
    status_code: int = 200,
) -> Response:
    """The experiment form. ``proposed``: its target batch size and timings are the task's proposal, and the page
    may replace them with the proposal for another task or swarm size (until the organizer types their own)."""
    task, params = str(values.get("task") or ""), values.get("task_params") or {}
    proposal = experiments.proposal_for(task, params) if task in available_tasks() else None
    return render(
        request,
        "experiment_form.html",
        {
            "values": values,
            "errors": errors,
            "experiment": experiment,
            "tasks": task_forms(),
            "optimizers": [o.value for o in OptimizerName],
            "overlaps": [o.value for o in Overlap],
            "aggregations": [a.value for a in Aggregation],
            "policies": [p.value for p in experiments.JoinPolicy],
            "proposal": proposal,
            "planned_peers": getattr(request.state, "planned_peers", "") or DEFAULT_PLANNED_PEERS,
            "proposed": proposed,
            "fastest_peer_rate": fastest_peer_rate,
        },
        user=user,
        web=web,
        status_code=status_code,
    )


@router.get("/")
def index(request: Request, session: DB, user: PageUser, web: WebSess) -> Response:
    """The experiments the visitor may see, with the hub's figures (the public experiments': ``hub.py``)."""
    figures = services(request.app).hub.hub(session)
    context = {
        "experiments": experiments.list_visible(session, user),
        "hub": figures,
        "figures": {e.slug: e for e in figures.experiments},
    }
    return render(request, "index.html", context, user=user, web=web)


@router.get("/experiments/new")
def new_experiment_page(request: Request, user: RequiredPageUser, web: WebSess) -> Response:
    defaults = {
        **TrainingSettings().model_dump(mode="json"),
        "join_policy": "open",
        "allowlist": [],
        "max_peers_per_volunteer": experiments.DEFAULT_MAX_PEERS_PER_VOLUNTEER,
        "aux_peer": True,  # the swarm's witness: without it no work counts as verified
        "auto_remove_flags": 0,
    }
    proposal = experiments.proposal_for(defaults["task"], defaults["task_params"])
    if proposal is not None:  # the default task's own proposal, as the API gives an experiment created without them
        defaults.update({name: getattr(proposal, name) for name in experiments.PROPOSED_FIELDS})
    return _form_page(request, user, web, values=defaults, errors={}, proposed=proposal is not None)


@router.post("/experiments/new", dependencies=[CSRF])
async def create_experiment(
    request: Request, session: DB, settings: AppSettings, user: RequiredPageUser, web: WebSess
) -> Response:
    data, errors = await _experiment_form(request)
    try:
        body = experiments.ExperimentCreate.model_validate(data)
    except ValidationError as exc:
        errors = {**form_errors(exc), **errors}
        if any(key.startswith("param.") for key in errors):
            errors.pop("task_params", None)  # already shown next to each parameter
        return _form_page(request, user, web, values=data, errors=errors, status_code=422)
    if errors:
        return _form_page(request, user, web, values=data, errors=errors, status_code=422)
    try:
        quotas.check_create(session, settings, user)
        experiment = experiments.create(session, user, body)
    except AppError as exc:
        return _form_page(
            request, user, web, values=data, errors={exc.field or "form": exc.message}, status_code=exc.status_code
        )
    return see_other(f"/experiments/{experiment.slug}")


def _dashboard(
    request: Request,
    session: DB,
    settings: AppSettings,
    experiment: Any,
    user: Any,
    web: Any,
    *,
    corpus_error: dict[str, str] | None = None,
    status_code: int = 200,
    teams_after: teams.ExperimentTeamCursor | None = None,
) -> Response:
    can_manage = experiments.can_manage(experiment, user)
    needs_corpus = experiments.needs_corpus(experiment)
    corpus_kind = training_data.corpus_kind(experiment)
    swarm = None
    if can_manage:
        states = services(request.app).coordinator.peer_states(session, experiments.run_id(experiment))
        swarm = swarm_view.view(session, experiment, settings.active_window_seconds, states)
    fastest = max((peer.peak_samples_per_second for peer in swarm.peers), default=0.0) if swarm else 0.0
    context = {
        "experiment": experiment,
        "can_manage": can_manage,
        "banned": experiments.banned_usernames(session, experiment) if can_manage else [],
        "actions": [a for a, (src, _) in experiments.TRANSITIONS.items() if experiment.status in src],
        "needs_corpus": needs_corpus,
        "keeps_checkpoints": experiments.keeps_checkpoints(experiment),
        "checkpoint_words": experiments.checkpoint_words(experiment),
        "kept_checkpoints": [  # newest first
            c for c in reversed(training_data.checkpoints(session, experiment, limit=50)) if c.downloadable
        ]
        if can_manage
        else [],
        "corpus": data.corpus_view(session, experiment) if needs_corpus else None,
        "corpus_kind": corpus_kind,
        "corpus_sources": training_data.sources(settings, corpus_kind) if can_manage and needs_corpus else [],
        "corpus_limit": corpus_upload.size_text(data.max_upload_bytes(settings, experiment)),
        "corpus_error": corpus_error or {},
        "corpus_defaults": training_data.CorpusOptions(),
        "image_defaults": image_data.ImageOptions(),
        "team_standings": teams.experiment_standings_page(session, experiment, after=teams_after),
        "swarm": swarm,
        "rate_cap": swarm_rate_cap(experiment.target_batch_size, experiment.matchmaking_time),
        # The fastest peer's own rate, for the organizer: the settings throttle the swarm when it is above the cap
        "fastest_peer_rate": fastest,
        "unthrottled_batch": unthrottled_batch(fastest, experiment.matchmaking_time),
    }
    return render(request, "dashboard.html", context, user=user, web=web, status_code=status_code)


@router.get("/experiments/{slug}")
def dashboard(
    request: Request,
    slug: str,
    session: DB,
    settings: AppSettings,
    user: PageUser,
    web: WebSess,
    teams_cursor: After = None,
) -> Response:
    """The dashboard; its Teams table is a page of the experiment's teams (``teams_cursor``: the next ones)."""
    teams_after = teams.ExperimentTeamCursor.decode(teams_cursor, "teams_cursor") if teams_cursor else None
    experiment = experiments.get_visible(session, slug, user)
    return _dashboard(request, session, settings, experiment, user, web, teams_after=teams_after)


@router.post("/experiments/{slug}/corpus", dependencies=[CSRF, limited("corpus")])
async def set_corpus(
    request: Request, slug: str, session: DB, settings: AppSettings, user: RequiredPageUser, web: WebSess
) -> Response:
    """The organizer's training-data form: an upload or a corpus the server offers, prepared before answering."""
    experiment = experiments.get_managed(session, slug, user)
    form = await request.form()
    upload = form.get("file")
    source = form.get("source")
    try:
        given = {k: form.get(k) for k in ("vocab_size", "seq_length", "image_size") if form.get(k) not in (None, "")}
        options = training_data.CorpusOptions.model_validate(given)  # each model takes its own fields
        image_options = image_data.ImageOptions.model_validate(given)
        await data.set_corpus_from_form(
            session,
            settings,
            experiment,
            user,
            upload if isinstance(upload, UploadFile) else None,
            source if isinstance(source, str) and source else None,
            options,
            image_options,
        )
    except ValidationError as exc:
        session.rollback()
        return _dashboard(
            request, session, settings, experiment, user, web, corpus_error=form_errors(exc), status_code=422
        )
    except AppError as exc:
        session.rollback()
        errors = {exc.field or "file": exc.message}
        return _dashboard(
            request, session, settings, experiment, user, web, corpus_error=errors, status_code=exc.status_code
        )
    return see_other(f"/experiments/{experiment.slug}#training-data")


@router.get("/experiments/{slug}/edit")
def edit_experiment_page(request: Request, slug: str, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    experiment = experiments.get_managed(session, slug, user)
    values = experiments.to_public(experiment).model_dump(mode="json")
    fastest = experiments.fastest_peer_rate(session, experiment)
    return _form_page(request, user, web, values=values, errors={}, experiment=experiment, fastest_peer_rate=fastest)


@router.post("/experiments/{slug}/edit", dependencies=[CSRF])
async def edit_experiment(
    request: Request, slug: str, session: DB, settings: AppSettings, user: RequiredPageUser, web: WebSess
) -> Response:
    experiment = experiments.get_managed(session, slug, user)
    data, errors = await _experiment_form(request)
    data.pop("slug", None)  # the slug is the experiment's address: it never changes
    values = {**data, "slug": experiment.slug}
    if not errors:
        try:
            changes = experiments.ExperimentUpdate.model_validate(data)
            quotas.check_update(session, settings, experiment, user, changes)
            experiments.update(session, experiment, changes)
        except ValidationError as exc:
            errors = form_errors(exc)
        except AppError as exc:
            errors = {exc.field or "form": exc.message}
    if errors:
        session.rollback()
        fastest = experiments.fastest_peer_rate(session, experiment)
        return _form_page(
            request,
            user,
            web,
            values=values,
            errors=errors,
            experiment=experiment,
            fastest_peer_rate=fastest,
            status_code=422,
        )
    return see_other(f"/experiments/{experiment.slug}")


@router.post("/experiments/{slug}/status", dependencies=[CSRF])
async def change_status(
    request: Request, slug: str, session: DB, settings: AppSettings, user: RequiredPageUser
) -> Response:
    form = await request.form()
    action = str(form.get("action", ""))
    if action not in experiments.TRANSITIONS:
        raise AppError(f"unknown action {action!r}", field="action")
    experiment = experiments.get_managed(session, slug, user)
    quotas.check_status_change(session, settings, experiment, user, action)
    experiments.change_status(session, experiment, action)
    reconcile_after_commit(request, session)
    return see_other(f"/experiments/{slug}")


@router.post("/experiments/{slug}/rollback", dependencies=[CSRF])
async def roll_back(request: Request, slug: str, session: DB, user: RequiredPageUser) -> Response:
    """Restore a kept checkpoint as the swarm's state, from the experiment's page
    (``server/experiments/rollback.py``)."""
    form = await request.form()
    experiment = experiments.get_managed(session, slug, user)
    try:
        epoch = int(str(form.get("epoch", "")))
    except ValueError:
        raise AppError("choose one of the kept checkpoints", field="epoch") from None
    rollback.request(session, experiment, epoch)
    reconcile_after_commit(request, session)  # the reconcile reads the request
    return see_other(f"/experiments/{slug}")


@router.post("/experiments/{slug}/bans", dependencies=[CSRF])
async def change_ban(request: Request, slug: str, session: DB, user: RequiredPageUser) -> Response:
    """Remove a volunteer (or let them back in) from the experiment's page."""
    form = await request.form()
    experiment = experiments.get_managed(session, slug, user)
    username = str(form.get("username", "")).strip()[:32]
    if form.get("action") == "unban":
        experiments.unban(session, experiment, username)
    else:
        experiments.ban(session, experiment, username)
    reconcile_after_commit(request, session)
    return see_other(f"/experiments/{slug}")


@router.get("/experiments/{slug}/invite/{code}")
def invite_page(request: Request, slug: str, code: str, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    """The invite link asks before it makes anyone a volunteer: a link opened from another site changes nothing."""
    experiment = experiments.invited(session, slug, code[:64])
    if experiments.is_member(session, experiment, user):
        return see_other(f"/experiments/{experiment.slug}")
    return render(request, "invite.html", {"experiment": experiment, "code": code[:64]}, user=user, web=web)


@router.post("/experiments/{slug}/invite/{code}", dependencies=[CSRF])
def accept_invite(slug: str, code: str, session: DB, user: RequiredPageUser) -> Response:
    experiment = experiments.accept_invite(session, slug, code[:64], user)
    return see_other(f"/experiments/{experiment.slug}?joined=1")
