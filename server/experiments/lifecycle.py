"""Experiments themselves: create, edit, move through draft -> running -> paused -> finished, find and list
them as a user may see them, and what their task needs from the server."""

from __future__ import annotations

import secrets

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.protocol import ExperimentStatus
from swarmhub.server.core.errors import Conflict, Forbidden, NotFound
from swarmhub.server.experiments.schemas import TRAINING_FIELDS, ExperimentCreate, ExperimentFields, ExperimentUpdate
from swarmhub.server.models import Corpus, Experiment, User, VolunteerTotal
from swarmhub.worker.tasks import UnknownTask, get_task

# Which status an action moves an experiment to, and from which statuses it may.
TRANSITIONS: dict[str, tuple[set[ExperimentStatus], ExperimentStatus]] = {
    "start": ({ExperimentStatus.draft, ExperimentStatus.paused}, ExperimentStatus.running),
    "pause": ({ExperimentStatus.running}, ExperimentStatus.paused),
    "finish": ({ExperimentStatus.draft, ExperimentStatus.running, ExperimentStatus.paused}, ExperimentStatus.finished),
}


def fastest_peer_rate(session: Session, experiment: Experiment) -> float:
    """The highest samples/s any volunteer's peer has signed in this experiment's swarm (0 before any)."""
    rate = session.scalar(
        select(func.max(VolunteerTotal.peak_signed_samples_per_second)).where(
            VolunteerTotal.experiment_id == experiment.id
        )
    )
    return float(rate or 0.0)


def needs_corpus(experiment: Experiment) -> bool:
    """Whether the experiment's task trains on a corpus the server serves (False for a task not installed here)."""
    try:
        return get_task(experiment.task).needs_corpus
    except UnknownTask:
        return False


def keeps_checkpoints(experiment: Experiment) -> bool:
    """Whether the server runs a checkpoint peer for the experiment's task."""
    try:
        return get_task(experiment.task).keeps_checkpoints
    except UnknownTask:
        return False


def checkpoint_words(experiment: Experiment) -> dict[str, str]:
    """The dashboard's words for the experiment's checkpoints (``Task.held_out_words``, ``accuracy_words``,
    ``download_words``); empty for a task not installed here."""
    try:
        task = get_task(experiment.task)
    except UnknownTask:
        return {}
    return {"held_out": task.held_out_words, "accuracy": task.accuracy_words, "download": task.download_words}


def run_id(experiment: Experiment) -> str:
    """hivemind's run_id: the DHT key prefix every peer of the experiment shares."""
    return f"swarmhub-{experiment.slug}-{experiment.id}"


def by_run_id(session: Session, run_id_: str) -> Experiment | None:
    """The experiment whose swarm uses ``run_id_`` (see :func:`run_id`)."""
    _, _, ident = run_id_.rpartition("-")
    experiment = session.get(Experiment, int(ident)) if ident.isdigit() else None
    return experiment if experiment is not None and run_id(experiment) == run_id_ else None


# The experiments anyone may see, signed in or not, as a SQL condition: every one but drafts. What ``can_view``
# grants to no one in particular; the open figures (front page, profiles, teams, milestones, statistics exports)
# count these only, so that what they show is the same for every viewer.
PUBLIC = Experiment.status != ExperimentStatus.draft


def can_view(experiment: Experiment, user: User | None) -> bool:
    return experiment.status != ExperimentStatus.draft or (
        user is not None and (user.id == experiment.owner_id or user.is_admin)
    )


def can_manage(experiment: Experiment, user: User | None) -> bool:
    return user is not None and (user.id == experiment.owner_id or user.is_admin)


def experiment_by_slug(session: Session, slug: str) -> Experiment | None:
    if "\x00" in slug:  # no slug has one, and PostgreSQL refuses one even in a query
        return None
    return session.scalar(select(Experiment).where(Experiment.slug == slug))


def get_visible(session: Session, slug: str, user: User | None) -> Experiment:
    """The experiment, or 404: drafts are invisible to everyone but their owner and admins."""
    experiment = experiment_by_slug(session, slug)
    if experiment is None or not can_view(experiment, user):
        raise NotFound(f"no experiment {slug!r}")
    return experiment


def get_managed(session: Session, slug: str, user: User) -> Experiment:
    experiment = get_visible(session, slug, user)
    if not can_manage(experiment, user):
        raise Forbidden("only the experiment's organizer can change it")
    return experiment


def list_visible(session: Session, user: User | None) -> list[Experiment]:
    stmt = select(Experiment)
    if user is None:
        stmt = stmt.where(PUBLIC)
    elif not user.is_admin:
        stmt = stmt.where(or_(PUBLIC, Experiment.owner_id == user.id))
    return list(session.scalars(stmt.order_by(Experiment.created_at.desc(), Experiment.id.desc())))


def create(session: Session, owner: User, data: ExperimentCreate) -> Experiment:
    if session.scalar(select(Experiment.id).where(Experiment.slug == data.slug)) is not None:
        raise Conflict(f"the slug {data.slug!r} is taken", field="slug")
    experiment = Experiment(
        owner_id=owner.id,
        status=ExperimentStatus.draft.value,
        signing_key=swarm_tokens.new_signing_key_der(),
        invite_code=secrets.token_urlsafe(16),
        **data.model_dump(mode="json"),
    )
    session.add(experiment)
    session.flush()
    session.refresh(experiment)
    return experiment


def update(session: Session, experiment: Experiment, data: ExperimentUpdate) -> Experiment:
    changes = data.model_dump(exclude_unset=True, mode="json")
    if experiment.status == ExperimentStatus.finished:
        raise Conflict("a finished experiment cannot be edited")
    merged = {
        name: getattr(experiment, name)
        for name in (
            "title",
            "description",
            "join_policy",
            "allowlist",
            "aux_peer",
            "checkpoint_minutes",
            "max_peers_per_volunteer",
            "auto_remove_flags",
            *TRAINING_FIELDS,
        )
    }
    merged.update({k: v for k, v in changes.items() if v is not None})
    if "task" in changes and "task_params" not in changes:
        merged["task_params"] = {}  # another task's parameters do not carry over
    valid = ExperimentFields.model_validate(merged)  # raises a ValidationError naming the field
    # Compared once validated: a form sends "64" where the experiment holds 64, and that is no change.
    new = valid.model_dump(mode="json")
    training_changes = [name for name in TRAINING_FIELDS if new[name] != getattr(experiment, name)]
    if training_changes and experiment.status == ExperimentStatus.running:
        raise Conflict("pause the experiment before changing how it trains", field=training_changes[0])
    for name, value in valid.model_dump(mode="json").items():
        setattr(experiment, name, value)
    session.flush()
    return experiment


def change_status(session: Session, experiment: Experiment, action: str) -> Experiment:
    allowed_from, target = TRANSITIONS[action]
    if ExperimentStatus(experiment.status) not in allowed_from:
        raise Conflict(f"cannot {action} an experiment that is {experiment.status}", field="action")
    if target == ExperimentStatus.running and needs_corpus(experiment):
        if session.get(Corpus, experiment.id) is None:
            raise Conflict(
                f"the task {experiment.task!r} trains on a corpus: give the experiment its training text first",
                field="corpus",
            )
    experiment.status = target.value
    session.flush()
    return experiment


def running(session: Session) -> list[Experiment]:
    return list(session.scalars(select(Experiment).where(Experiment.status == ExperimentStatus.running)))
