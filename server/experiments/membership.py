"""Who takes part in an experiment: the join policy (open, invite, allowlist) and invitations, the volunteers an
organizer removed (bans), and the worker runs of those who joined."""

from __future__ import annotations

import secrets
import uuid

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from swarmhub.common.protocol import ExperimentStatus
from swarmhub.server.accounts.users import user_named
from swarmhub.server.core.errors import Conflict, Forbidden, NotFound, Removed
from swarmhub.server.experiments.lifecycle import can_manage, experiment_by_slug
from swarmhub.server.experiments.schemas import JoinPolicy
from swarmhub.server.models import Experiment, ExperimentBan, ExperimentMember, User, WorkerRun


def check_joinable(session: Session, experiment: Experiment, user: User) -> None:
    """Raise unless ``user`` may join ``experiment`` now (removed, not invited or listed, not running)."""
    check_may_join(session, experiment, user)
    if experiment.status != ExperimentStatus.running:
        raise Conflict(f"experiment {experiment.slug!r} is {experiment.status}: it is not accepting volunteers now")


def start_worker_run(
    session: Session,
    experiment: Experiment,
    user: User,
    device: str,
    *,
    peer_id: str | None = None,
    precision: str | None = None,
    client_mode: bool | None = None,
    role: str | None = None,
    bandwidth_mbps: float | None = None,
) -> WorkerRun:
    """A worker run of ``user``: ``peer_id`` is its peer as the server derived it from the join's peer key; the
    other keywords are what the worker reported of how that peer takes part (None: not reported)."""
    check_joinable(session, experiment, user)
    worker = WorkerRun(
        id=uuid.uuid4().hex,
        experiment_id=experiment.id,
        user_id=user.id,
        device=device,
        peer_id=peer_id,
        precision=precision,
        client_mode=client_mode,
        role=role,
        bandwidth_mbps=bandwidth_mbps,
    )
    session.add(worker)
    session.flush()
    return worker


def banned_usernames(session: Session, experiment: Experiment) -> list[str]:
    stmt = (
        select(User.username)
        .join(ExperimentBan, ExperimentBan.user_id == User.id)
        .where(ExperimentBan.experiment_id == experiment.id)
        .order_by(User.username)
    )
    return list(session.scalars(stmt))


def is_banned(session: Session, experiment: Experiment, user: User) -> bool:
    stmt = select(ExperimentBan.id).where(
        ExperimentBan.experiment_id == experiment.id, ExperimentBan.user_id == user.id
    )
    return session.scalar(stmt) is not None


def ban(session: Session, experiment: Experiment, username: str) -> None:
    """Remove a volunteer: no more tokens from now on, and every peer refuses them once it polls."""
    user = user_named(session, username)
    if user is None:
        raise NotFound(f"no user {username!r}", field="username")
    if user.id == experiment.owner_id:
        raise Conflict("the organizer cannot remove themselves", field="username")
    if not is_banned(session, experiment, user):
        session.add(ExperimentBan(experiment_id=experiment.id, user_id=user.id))
        session.flush()


def unban(session: Session, experiment: Experiment, username: str) -> None:
    user = user_named(session, username)
    if user is not None:
        session.execute(
            delete(ExperimentBan).where(ExperimentBan.experiment_id == experiment.id, ExperimentBan.user_id == user.id)
        )


def check_may_join(session: Session, experiment: Experiment, user: User) -> None:
    if is_banned(session, experiment, user):
        raise Removed(f"you were removed from {experiment.slug!r} by its organizer")
    if can_manage(experiment, user) or experiment.join_policy == JoinPolicy.open:
        return
    if experiment.join_policy == JoinPolicy.allowlist and user.username not in (experiment.allowlist or []):
        raise Forbidden(f"{experiment.slug!r} takes only the volunteers its organizer listed: ask them to add you")
    if experiment.join_policy == JoinPolicy.invite and not is_member(session, experiment, user):
        raise Forbidden(f"{experiment.slug!r} takes volunteers by invitation: open the invite link from its organizer")


def is_member(session: Session, experiment: Experiment, user: User) -> bool:
    stmt = select(ExperimentMember.id).where(
        ExperimentMember.experiment_id == experiment.id, ExperimentMember.user_id == user.id
    )
    return session.scalar(stmt) is not None


def invited(session: Session, slug: str, code: str) -> Experiment:
    """The experiment the invite link is for, or 404 when the link is not (or no longer) its own."""
    experiment = experiment_by_slug(session, slug)
    # Compared as bytes: compare_digest raises TypeError on str with non-ASCII characters.
    if experiment is None or not secrets.compare_digest(experiment.invite_code.encode(), code.encode()):
        raise NotFound("this invite link is not valid: ask the organizer for a new one")
    return experiment


def accept_invite(session: Session, slug: str, code: str, user: User) -> Experiment:
    """The signed-in volunteer who confirms the invite link becomes a volunteer of the experiment."""
    experiment = invited(session, slug, code)
    if not is_member(session, experiment, user):
        session.add(ExperimentMember(experiment_id=experiment.id, user_id=user.id))
        session.flush()
    return experiment
