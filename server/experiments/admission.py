"""A volunteer's peers admitted to the experiment's swarm: their RSA peer keys checked, and swarm tokens signed
for them, within the experiment's peers-per-volunteer limit."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from sqlalchemy import delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.protocol import ExperimentStatus, SwarmToken
from swarmhub.server.core.errors import BadRequest, Conflict, TooManyRequests
from swarmhub.server.experiments.lifecycle import run_id
from swarmhub.server.experiments.membership import check_may_join
from swarmhub.server.models import Experiment, SwarmPeerKey, User, utcnow

# hivemind's own peer identities are RSA-2048; a shorter key is within reach of factoring, and whoever factors a
# volunteer's key can act as that peer with the token the server signed for it.
MIN_PEER_KEY_BITS = 2048


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
            "(swarmhub's worker makes one: `swarmhub upgrade` installs the one this hub serves)",
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
    check_may_join(session, experiment, user)
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


def _valid_keys_of(user: User, now: datetime) -> tuple[Any, ...]:
    """``user``'s peer keys whose newest token is still valid: what ``max_peers_per_volunteer`` counts."""
    return (SwarmPeerKey.user_id == user.id, SwarmPeerKey.expires_at > now)


@dataclass(frozen=True)
class PeersHeld:
    """A volunteer's peer keys with a valid token in one experiment: how many, and when the first token expires."""

    count: int = 0
    first_expiry: datetime | None = None


def peers_held(session: Session, user: User, now: datetime) -> dict[int, PeersHeld]:
    """Experiment ID -> the peer keys ``user`` holds valid tokens for there at ``now`` (experiments with none left
    out): what :func:`check_room` takes, for every experiment in one query."""
    rows = session.execute(
        select(SwarmPeerKey.experiment_id, func.count(), func.min(SwarmPeerKey.expires_at))
        .where(*_valid_keys_of(user, now))
        .group_by(SwarmPeerKey.experiment_id)
    )
    return {experiment_id: PeersHeld(count, first) for experiment_id, count, first in rows}


def _check_room(session: Session, experiment: Experiment, user: User, key: PeerKey, now: datetime) -> None:
    """:func:`check_room` for ``user``'s valid keys in ``experiment``, ``key`` aside (it is renewed, not added)."""
    count, first_expiry = session.execute(
        select(func.count(), func.min(SwarmPeerKey.expires_at)).where(
            *_valid_keys_of(user, now),
            SwarmPeerKey.experiment_id == experiment.id,
            SwarmPeerKey.peer_id != key.peer_id,
        )
    ).one()
    check_room(experiment, PeersHeld(count, first_expiry), now)


def check_room(experiment: Experiment, held: PeersHeld, now: datetime) -> None:
    """429 unless a volunteer who holds ``held`` in ``experiment`` may have one more peer key admitted there: fewer
    than its ``max_peers_per_volunteer``. The one rule for the join, a token for a new key, and the joinable list."""
    limit = experiment.max_peers_per_volunteer
    if held.count < limit:
        return
    # 429, not 403: the volunteer may run another peer once one of theirs stops renewing its token, at a time the
    # server knows (Retry-After), and clients treat 429 as "later" where 403 means "never".
    first_expiry = held.first_expiry or now  # held.count > 0 here: some token expires first
    seconds = max(1, math.ceil((first_expiry - now).total_seconds()))
    raise TooManyRequests(
        f"you already run {held.count} peer{'s' if held.count != 1 else ''} in {experiment.slug!r}, and its organizer "
        f"allows {limit} per volunteer (max_peers_per_volunteer): stop one of your peers or wait for its token to "
        f"expire at {swarm_tokens.format_expiry(first_expiry)}",
        field="peer_public_key",
        headers={"Retry-After": str(seconds)},
    )


def experiment_public_key(experiment: Experiment) -> str:
    return swarm_tokens.public_key_text(swarm_tokens.signing_key_from_text(experiment.signing_key))
