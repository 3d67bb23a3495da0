"""Experiments: create, edit, move through draft -> running -> paused -> finished, list, join."""

from __future__ import annotations

import math
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator
from sqlalchemy import delete, func, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.worker import swarm_tokens
from swarmhub.worker.protocol import (
    SLUG_RE,
    Aggregation,
    ExperimentConfig,
    ExperimentStatus,
    ExperimentSummary,
    OptimizerName,
    Overlap,
    SwarmToken,
    TrainingSettings,
)
from swarmhub.worker.tasks import UnknownTask, get_task

from .accounts import USERNAME_RE, user_named
from .errors import BadRequest, Conflict, Forbidden, NotFound, Removed, TooManyRequests
from .models import (
    Corpus,
    Experiment,
    ExperimentBan,
    ExperimentMember,
    SwarmPeerKey,
    User,
    WorkerRun,
    utcnow,
)
from .security import StoredText

# Which status an action moves an experiment to, and from which statuses it may.
TRANSITIONS: dict[str, tuple[set[ExperimentStatus], ExperimentStatus]] = {
    "start": ({ExperimentStatus.draft, ExperimentStatus.paused}, ExperimentStatus.running),
    "pause": ({ExperimentStatus.running}, ExperimentStatus.paused),
    "finish": ({ExperimentStatus.draft, ExperimentStatus.running, ExperimentStatus.paused}, ExperimentStatus.finished),
}
TRAINING_FIELDS = tuple(TrainingSettings.model_fields)
# hivemind's own peer identities are RSA-2048; a shorter key is within reach of factoring, and whoever factors a
# volunteer's key can act as that peer with the token the server signed for it.
MIN_PEER_KEY_BITS = 2048
DEFAULT_MAX_PEERS_PER_VOLUNTEER = 4


def _check_task_params(task: str, params: dict[str, Any]) -> dict[str, Any]:
    try:
        return get_task(task).Params.model_validate(params).model_dump()
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "task_params"
        raise ValueError(f"{where}: {first['msg']}") from None


class JoinPolicy(str, Enum):
    open = "open"  # anyone signed in
    invite = "invite"  # volunteers who opened the experiment's invite link
    allowlist = "allowlist"  # the usernames listed by the organizer


class ExperimentFields(TrainingSettings):
    title: StoredText = Field(min_length=1, max_length=120)
    description: StoredText = Field(default="", max_length=5000)
    task_params: dict[str, Any] = Field(default_factory=dict, validate_default=True)
    join_policy: JoinPolicy = JoinPolicy.open
    allowlist: list[str] = Field(default_factory=list, max_length=10_000)
    aux_peer: bool = Field(
        default=True,
        description="The server runs an auxiliary peer that helps average (no gradients of its own) and witnesses "
        "every averaging round: only rounds it witnessed count as verified work",
    )
    checkpoint_minutes: float = Field(
        default=10.0,
        ge=0.1,
        le=10_080,
        description="How often the server saves the swarm's model and measures its held-out loss "
        "(tasks that keep checkpoints)",
    )
    max_peers_per_volunteer: int = Field(
        default=DEFAULT_MAX_PEERS_PER_VOLUNTEER,
        ge=1,
        le=64,
        description="How many peers one volunteer may run in the swarm at once: peer keys with a valid swarm token",
    )
    auto_remove_flags: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="Remove a volunteer once the server's peers flagged their peers this many times (non-finite "
        "gradients, an epoch ahead of the swarm, a poisoned state); 0: never",
    )

    @field_validator("allowlist", mode="before")
    @classmethod
    def _usernames(cls, value: Any) -> Any:
        if isinstance(value, str):  # the form's textarea: names separated by spaces, commas or lines
            value = [name for name in value.replace(",", " ").split() if name]
        if isinstance(value, list):
            for name in value:
                if not isinstance(name, str) or not USERNAME_RE.match(name):
                    raise ValueError(f"{name!r} is not a username")
            return sorted(set(value))
        return value

    @field_validator("title")
    @classmethod
    def _strip(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("title must not be blank")
        return value.strip()

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        try:
            get_task(value)
        except UnknownTask as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("task_params")
    @classmethod
    def _task_params(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "task" not in info.data:
            return value  # the task itself is wrong; that error names the field
        return _check_task_params(info.data["task"], value)


class ExperimentCreate(ExperimentFields):
    slug: str = Field(min_length=3, max_length=50, description="lowercase letters, digits and '-'")

    @field_validator("slug")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not SLUG_RE.match(value):
            raise ValueError("use 3-50 lowercase letters, digits and '-', not starting or ending with '-'")
        return value


class ExperimentUpdate(BaseModel):
    """A partial edit. Bounds are checked once, on the merged result, by ``ExperimentFields``."""

    model_config = {"extra": "forbid"}

    title: str | None = None
    description: str | None = None
    task: str | None = None
    task_params: dict[str, Any] | None = None
    optimizer: OptimizerName | None = None
    learning_rate: float | None = None
    target_batch_size: int | None = None
    matchmaking_time: float | None = None
    averaging_timeout: float | None = None
    overlap: Overlap | None = None
    aggregation: Aggregation | None = None
    aux_peer: bool | None = None
    checkpoint_minutes: float | None = None
    max_peers_per_volunteer: int | None = None
    auto_remove_flags: int | None = None
    join_policy: JoinPolicy | None = None
    allowlist: list[str] | str | None = None


class ExperimentPublic(ExperimentSummary):
    task_params: dict[str, Any]
    optimizer: OptimizerName
    learning_rate: float
    target_batch_size: int
    matchmaking_time: float
    averaging_timeout: float
    overlap: Overlap
    aggregation: Aggregation
    aux_peer: bool
    checkpoint_minutes: float
    max_peers_per_volunteer: int
    auto_remove_flags: int
    join_policy: JoinPolicy
    updated_at: datetime


class StatusChange(BaseModel):
    action: str = Field(pattern="^(start|pause|finish)$")


def to_public(experiment: Experiment) -> ExperimentPublic:
    return ExperimentPublic(
        slug=experiment.slug,
        title=experiment.title,
        description=experiment.description,
        status=ExperimentStatus(experiment.status),
        owner=experiment.owner.username,
        task=experiment.task,
        task_params=experiment.task_params,
        optimizer=OptimizerName(experiment.optimizer),
        learning_rate=experiment.learning_rate,
        target_batch_size=experiment.target_batch_size,
        matchmaking_time=experiment.matchmaking_time,
        averaging_timeout=experiment.averaging_timeout,
        overlap=Overlap(experiment.overlap),
        aggregation=Aggregation(experiment.aggregation),
        aux_peer=experiment.aux_peer,
        checkpoint_minutes=experiment.checkpoint_minutes,
        max_peers_per_volunteer=experiment.max_peers_per_volunteer,
        auto_remove_flags=experiment.auto_remove_flags,
        join_policy=JoinPolicy(experiment.join_policy),
        created_at=experiment.created_at,
        updated_at=experiment.updated_at,
    )


def to_config(experiment: Experiment) -> ExperimentConfig:
    return ExperimentConfig(
        slug=experiment.slug,
        title=experiment.title,
        **{name: getattr(experiment, name) for name in TRAINING_FIELDS},
    )


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


def run_id(experiment: Experiment) -> str:
    """hivemind's run_id: the DHT key prefix every peer of the experiment shares."""
    return f"swarmhub-{experiment.slug}-{experiment.id}"


def by_run_id(session: Session, run_id_: str) -> Experiment | None:
    """The experiment whose swarm uses ``run_id_`` (see :func:`run_id`)."""
    _, _, ident = run_id_.rpartition("-")
    experiment = session.get(Experiment, int(ident)) if ident.isdigit() else None
    return experiment if experiment is not None and run_id(experiment) == run_id_ else None


def can_view(experiment: Experiment, user: User | None) -> bool:
    return experiment.status != ExperimentStatus.draft or (
        user is not None and (user.id == experiment.owner_id or user.is_admin)
    )


def can_manage(experiment: Experiment, user: User | None) -> bool:
    return user is not None and (user.id == experiment.owner_id or user.is_admin)


def _by_slug(session: Session, slug: str) -> Experiment | None:
    if "\x00" in slug:  # no slug has one, and PostgreSQL refuses one even in a query
        return None
    return session.scalar(select(Experiment).where(Experiment.slug == slug))


def get_visible(session: Session, slug: str, user: User | None) -> Experiment:
    """The experiment, or 404: drafts are invisible to everyone but their owner and admins."""
    experiment = _by_slug(session, slug)
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
        stmt = stmt.where(Experiment.status != ExperimentStatus.draft)
    elif not user.is_admin:
        stmt = stmt.where(or_(Experiment.status != ExperimentStatus.draft, Experiment.owner_id == user.id))
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


def check_joinable(session: Session, experiment: Experiment, user: User) -> None:
    """Raise unless ``user`` may join ``experiment`` now (removed, not invited or listed, not running)."""
    _check_may_join(session, experiment, user)
    if experiment.status != ExperimentStatus.running:
        raise Conflict(f"experiment {experiment.slug!r} is {experiment.status}: it is not accepting volunteers now")


def start_worker_run(session: Session, experiment: Experiment, user: User, device: str) -> WorkerRun:
    check_joinable(session, experiment, user)
    worker = WorkerRun(id=uuid.uuid4().hex, experiment_id=experiment.id, user_id=user.id, device=device)
    session.add(worker)
    session.flush()
    return worker


@dataclass(frozen=True)
class PeerKey:
    """A peer's RSA public key, as its swarm token binds it (OpenSSH text), and its hivemind peer ID."""

    text: str
    peer_id: str


def peer_key(text: str) -> PeerKey:
    """``text`` as a peer key, or 400 naming ``peer_public_key``: an RSA public key of at least 2048 bits."""
    try:
        key = serialization.load_ssh_public_key(text.encode())
    except (ValueError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, rsa.RSAPublicKey):
        raise BadRequest("peer_public_key is not an RSA public key", field="peer_public_key")
    if key.key_size < MIN_PEER_KEY_BITS:
        raise BadRequest(
            f"peer_public_key is a {key.key_size}-bit RSA key: a peer's key needs at least {MIN_PEER_KEY_BITS} bits "
            "(swarmhub's worker makes one: `pip install -U swarmhub`)",
            field="peer_public_key",
        )
    return PeerKey(text=text, peer_id=swarm_tokens.peer_id_for_public_key(text.encode()))


def check_peer_key(session: Session, experiment: Experiment, user: User, peer_public_key: str) -> PeerKey:
    """Raise as :func:`swarm_token` would for this key now (400, 409, 429), without admitting it. Reads only."""
    key = peer_key(peer_public_key)
    now = utcnow()
    held = session.scalar(_held_key(experiment, key))
    if held is not None and held.user_id != user.id:
        raise _taken(experiment)
    if held is None or held.expires_at <= now:
        _check_room(session, experiment, user, key, now)
    return key


def swarm_token(
    session: Session, experiment: Experiment, user: User, peer_public_key: str, lifetime: timedelta
) -> SwarmToken:
    """Admit one peer key of ``user`` to the experiment's swarm for ``lifetime`` (running experiments only).

    A key the volunteer holds a valid token for is renewed. A new key, or one whose token expired, is admitted
    only while the volunteer holds valid tokens for fewer keys than the experiment's ``max_peers_per_volunteer``
    (else 429, with Retry-After: when the first of them expires). Refused with the field named: a key that is not
    RSA of at least 2048 bits (400), a key another volunteer holds in this experiment (409)."""
    _check_may_join(session, experiment, user)
    if experiment.status != ExperimentStatus.running:
        raise Conflict(f"experiment {experiment.slug!r} is {experiment.status}: it is not accepting volunteers now")
    key = peer_key(peer_public_key)
    try:
        token = swarm_tokens.sign_token(
            swarm_tokens.signing_key_from_text(experiment.signing_key),
            run_id(experiment),
            user.username,
            key.text.encode(),
            lifetime,
        )
    except ValueError:
        raise BadRequest("peer_public_key is not an RSA public key", field="peer_public_key") from None
    expires_at = swarm_tokens.parse_expiry(token.expiration_time)
    assert expires_at is not None  # sign_token writes the format parse_expiry reads
    _admit(session, experiment, user, key, expires_at)
    return SwarmToken(**swarm_tokens.token_to_wire(token))


def _admit(session: Session, experiment: Experiment, user: User, key: PeerKey, expires_at: datetime) -> None:
    """Record that ``key`` is ``user``'s and valid until ``expires_at``, if it may be (see :func:`swarm_token`)."""
    now = utcnow()
    # One volunteer's admissions one at a time, so that two requests at once cannot both take the last free slot.
    # PostgreSQL: a lock on the volunteer's row until the transaction ends (NO KEY UPDATE: rows that refer to the
    # user can still be written). SQLite has no row locks, but its one writer lock is taken by the first write, and
    # a new key's row is written below before the volunteer's keys are counted.
    session.execute(select(User.id).where(User.id == user.id).with_for_update(key_share=True))
    held = session.scalar(_held_key(experiment, key))
    if held is None:
        insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
        stored = session.scalar(
            insert(SwarmPeerKey)
            .values(
                experiment_id=experiment.id,
                user_id=user.id,
                peer_id=key.peer_id,
                public_key=key.text,
                first_issued_at=now,
                expires_at=expires_at,
            )
            .on_conflict_do_nothing(index_elements=["experiment_id", "peer_id"])
            .returning(SwarmPeerKey.id)
        )
        if stored is not None:
            try:
                _check_room(session, experiment, user, key, now)
            except TooManyRequests:
                session.execute(delete(SwarmPeerKey).where(SwarmPeerKey.id == stored))
                raise
            return
        held = session.scalars(_held_key(experiment, key)).one()  # a request at the same time stored it first
    if held.user_id != user.id:
        raise _taken(experiment)
    previous, held.expires_at = held.expires_at, expires_at
    session.flush()
    if previous <= now:  # an expired key comes back: it needs a free slot, as a new one does
        try:
            _check_room(session, experiment, user, key, now)
        except TooManyRequests:
            held.expires_at = previous
            session.flush()
            raise


def _held_key(experiment: Experiment, key: PeerKey) -> Any:
    stmt = select(SwarmPeerKey).where(SwarmPeerKey.experiment_id == experiment.id, SwarmPeerKey.peer_id == key.peer_id)
    return stmt.execution_options(populate_existing=True)


def _taken(experiment: Experiment) -> Conflict:
    return Conflict(
        f"this peer key was issued to another volunteer of {experiment.slug!r}: every volunteer's peers need keys "
        "of their own",
        field="peer_public_key",
    )


def _check_room(session: Session, experiment: Experiment, user: User, key: PeerKey, now: datetime) -> None:
    """429 unless ``user`` holds valid tokens for fewer keys than the experiment allows, ``key`` aside."""
    count, first_expiry = session.execute(
        select(func.count(), func.min(SwarmPeerKey.expires_at)).where(
            SwarmPeerKey.user_id == user.id,
            SwarmPeerKey.experiment_id == experiment.id,
            SwarmPeerKey.expires_at > now,
            SwarmPeerKey.peer_id != key.peer_id,
        )
    ).one()
    limit = experiment.max_peers_per_volunteer
    if count < limit:
        return
    # 429, not 403: the volunteer may run another peer once one of theirs stops renewing its token, at a time the
    # server knows (Retry-After), and clients treat 429 as "later" where 403 means "never".
    seconds = max(1, math.ceil((first_expiry - now).total_seconds()))
    raise TooManyRequests(
        f"you already run {count} peer{'s' if count != 1 else ''} in {experiment.slug!r}, and its organizer allows "
        f"{limit} per volunteer (max_peers_per_volunteer): stop one of your peers or wait for its token to expire "
        f"at {swarm_tokens.format_expiry(first_expiry)}",
        field="peer_public_key",
        headers={"Retry-After": str(seconds)},
    )


def experiment_public_key(experiment: Experiment) -> str:
    return swarm_tokens.public_key_text(swarm_tokens.signing_key_from_text(experiment.signing_key))


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


def _check_may_join(session: Session, experiment: Experiment, user: User) -> None:
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
    experiment = _by_slug(session, slug)
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


def running(session: Session) -> list[Experiment]:
    return list(session.scalars(select(Experiment).where(Experiment.status == ExperimentStatus.running)))
