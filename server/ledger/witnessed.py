"""Verified work: the averaging rounds that the server's auxiliary peer witnessed, and what its peers flagged.

The server's auxiliary peer takes part in every gradient averaging round as a reducer and publishes, for each
round it saw complete, the senders and the weight each counted for in the average (``worker/swarm/witness.py``); the
monitor peer reads that record and attributes each sender through the roster. This module keeps the ledger:

- ``witnessed_rounds`` (one row per round, by hivemind's group ID: a round read twice counts once) and
  ``round_credits`` (per sender: its weight and the samples credited);
- ``swarm_flags``: what the server's peers refused from a volunteer's peer, and the organizer's automatic
  removal after ``auto_remove_flags`` of them.

What a peer is owed over the last ``WINDOW_SECONDS`` is the weight it sent in the rounds witnessed over that
window (as the reducers capped it: at the target batch, and at twice the round's median claim with three senders
or more), up to the weight another volunteer's peer of its device class sent over the same window (this round
included, when it took part); each round pays it what it is owed less what it was already credited. A shortfall is
not lost: a peer held to the other's weight in one round is paid in a later one (or, when it sends no more, with the
last round the monitor reads) once the other's weight has grown past it. A peer gains at most what the
fastest peer of another volunteer of its class trained, as witnessed, over the same time (``_window_bound``), and an
account at most that per peer it runs (``max_peers_per_volunteer``). The bound is the other's witnessed weight, not
its credit: on a swarm whose rounds each hold one volunteer's peer and the witness (peers that finish their batches
at different moments), a bound on credits would hold each honest peer to the other's credit, which is held to its
own in turn, and neither would ever be credited. With no other volunteer of its class the bound is the fastest peer
of any other volunteer; with no other volunteer at all, the reducers' caps only.
A peer that publishes records, claims a huge batch or a made-up rate gains nothing beyond that: only rounds in
which the server's peer received a full, finite slice from it count, and none before its first progress record.
Where the guarantee ends: the fastest honest volunteer of a class is credited at most the second fastest's
gains, and two accounts that forge together bound each other (docs/security.md).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmhub.server.ledger import contributions
from swarmhub.server.models import Experiment, RoundCredit, SwarmFlag, SwarmPeer, User, VolunteerTotal, WitnessedRound

logger = logging.getLogger("swarmhub.witnessed")

# A volunteer's credit over this many seconds is held against the other volunteers' over the same seconds.
WINDOW_SECONDS = 600.0


class Sender(BaseModel):
    peer_id: str = Field(min_length=1, max_length=64)
    username: str = Field(min_length=1, max_length=64)
    weight: float = Field(ge=0.0, le=2**40, allow_inf_nan=False)


class Round(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    epoch: int = Field(ge=0, le=2**53)
    time: float = Field(allow_inf_nan=False)
    senders: list[Sender] = Field(max_length=10_000)


class Flag(BaseModel):
    id: str = Field(min_length=1, max_length=64)
    peer_id: str = Field(min_length=1, max_length=64)
    username: str = Field(min_length=1, max_length=64)
    reason: str = Field(min_length=1, max_length=200)
    count: int = Field(ge=1, le=1_000_000)


def parse_rounds(items: Any) -> list[Round]:
    return _parse(Round, items)


def parse_flags(items: Any) -> list[Flag]:
    return _parse(Flag, items)


def _parse(model: Any, items: Any) -> list[Any]:
    parsed = []
    for item in items if isinstance(items, list) else []:
        try:
            parsed.append(model.model_validate(item))
        except ValidationError:
            logger.warning("ignoring a malformed witness record: %.200r", item)
    return parsed


def record_rounds(session: Session, experiment: Experiment, rounds: list[Round], now: datetime) -> int:
    """Credit the senders of each round not seen before; returns how many rounds were new."""
    if not rounds:
        return 0
    known = set(
        session.scalars(
            select(WitnessedRound.round_id).where(
                WitnessedRound.experiment_id == experiment.id, WitnessedRound.round_id.in_([r.id for r in rounds])
            )
        )
    )
    fresh = sorted((r for r in {r.id: r for r in rounds}.values() if r.id not in known), key=lambda r: r.time)
    if not fresh:
        return 0
    names = {s.username for r in fresh for s in r.senders}
    users = dict(session.execute(select(User.username, User.id).where(User.username.in_(names))).tuples().all())
    totals = contributions.experiment_totals(session, experiment.id)  # locked, as every change of the totals
    first = datetime.fromtimestamp(min(fresh[0].time, now.timestamp()), timezone.utc)
    window, sent = _window_credits(session, experiment.id, first - timedelta(seconds=WINDOW_SECONDS))
    rows = contributions.volunteer_totals(session, experiment.id, set(users.values()) | {u for u, _ in sent})
    classes = _classes(session, experiment.id, {user_id for user_id, _ in sent}, rows)
    peer_ids = {s.peer_id for r in fresh for s in r.senders}
    known_peers = {
        peer.peer_id: peer
        for peer in session.scalars(
            select(SwarmPeer).where(SwarmPeer.experiment_id == experiment.id, SwarmPeer.peer_id.in_(peer_ids))
        )
    }

    def credit(row: WitnessedRound, user_id: int, peer_id: str, weight: float, credited: int) -> None:
        session.add(
            RoundCredit(
                round_pk=row.id,
                experiment_id=experiment.id,
                user_id=user_id,
                peer_id=peer_id,
                weight=weight,
                credited=credited,
            )
        )
        window[user_id, peer_id] = window.get((user_id, peer_id), 0) + credited
        sent[user_id, peer_id] = sent.get((user_id, peer_id), 0.0) + weight
        rows[user_id].verified_samples += credited
        totals.verified_samples += credited

    last: WitnessedRound | None = None
    for item in fresh:
        at = datetime.fromtimestamp(min(item.time, now.timestamp()), timezone.utc)
        last = WitnessedRound(experiment_id=experiment.id, round_id=item.id, epoch=item.epoch, witnessed_at=at)
        session.add(last)
        session.flush()
        before = dict(sent)
        # a round read before a peer's first record: nothing shows it was there, and its weight neither earns
        # it credit (now or later) nor raises another's bound
        weights = {
            (users[s.username], s.peer_id): s.weight
            for s in item.senders
            if s.username in users and s.peer_id in known_peers
        }
        for sender in item.senders:
            user_id = users.get(sender.username)
            if user_id is None:
                continue
            if sender.peer_id not in known_peers:
                credit(last, user_id, sender.peer_id, 0.0, 0)
                continue
            known_peers[sender.peer_id].last_round_at = at
            key = (user_id, sender.peer_id)
            # what the window owes the peer: its own witnessed weight, this round's included, up to the bound;
            # less what it was credited in the window (an earlier round's shortfall is paid once the bound allows)
            owed = min(before.get(key, 0.0) + sender.weight, _window_bound(before, weights, classes, user_id))
            credit(last, user_id, sender.peer_id, sender.weight, int(max(owed - window.get(key, 0), 0)))
    # Peers that took no part in the last round: what the rounds since raised their bound to is paid now, with the
    # last round, so that neither of two peers held to each other's weight is left short by the order of rounds.
    in_last = {(users[s.username], s.peer_id) for s in fresh[-1].senders if s.username in users}
    for key, own in list(sent.items()):
        if own <= 0 or key in in_last or last is None:
            continue
        owed = min(own, _window_bound(sent, {}, classes, key[0]))
        due = int(max(owed - window.get(key, 0), 0))
        if due > 0:
            credit(last, key[0], key[1], 0.0, due)
    session.flush()
    return len(fresh)


def _window_credits(
    session: Session, experiment_id: int, since: datetime
) -> tuple[dict[tuple[int, str], int], dict[tuple[int, str], float]]:
    """(user ID, peer ID) -> samples credited in the rounds witnessed since ``since``, and -> the weight (as the
    reducers capped it) sent in those rounds."""
    rows = session.execute(
        select(RoundCredit.user_id, RoundCredit.peer_id, func.sum(RoundCredit.credited), func.sum(RoundCredit.weight))
        .join(WitnessedRound, WitnessedRound.id == RoundCredit.round_pk)
        .where(WitnessedRound.experiment_id == experiment_id, WitnessedRound.witnessed_at >= since)
        .group_by(RoundCredit.user_id, RoundCredit.peer_id)
    ).all()
    credits = {(int(user_id), peer_id): int(total or 0) for user_id, peer_id, total, _ in rows}
    sent = {(int(user_id), peer_id): float(weight or 0.0) for user_id, peer_id, _, weight in rows}
    return credits, sent


def _classes(
    session: Session, experiment_id: int, user_ids: set[int], loaded: dict[int, VolunteerTotal]
) -> dict[int, set[str]]:
    """user ID -> the device classes its workers reported ("cpu" for one that reported none), for ``user_ids`` and
    the volunteers of the ``loaded`` totals rows (read only for the others)."""
    found = {user_id: set(row.device_classes or []) for user_id, row in loaded.items()}
    others = user_ids - loaded.keys()
    if others:
        rows = session.execute(
            select(VolunteerTotal.user_id, VolunteerTotal.device_classes).where(
                VolunteerTotal.experiment_id == experiment_id, VolunteerTotal.user_id.in_(others)
            )
        ).all()
        found.update({int(user_id): set(classes or []) for user_id, classes in rows})
    return {user_id: found.get(user_id) or {"cpu"} for user_id in user_ids | loaded.keys()}


def _window_bound(
    sent: dict[tuple[int, str], float],
    weights: dict[tuple[int, str], float],
    classes: dict[int, set[str]],
    user_id: int,
) -> float:
    """The most a peer of ``user_id`` may have been credited in the window with this round: the largest of another
    volunteer's peer's witnessed weight in the window plus its weight in this round, among the volunteers sharing a
    device class with ``user_id`` (among all others when none does); unbounded when no other volunteer's peer sent
    any."""
    peers = set(sent) | set(weights)
    others = {peer: sent.get(peer, 0.0) + weights.get(peer, 0.0) for peer in peers if peer[0] != user_id}
    others = {peer: amount for peer, amount in others.items() if amount > 0}  # a peer that sent nothing sets nothing
    own = classes.get(user_id, {"cpu"})
    same = [amount for (other, _), amount in others.items() if classes.get(other, {"cpu"}) & own]
    if same:
        return max(same)
    return max(others.values()) if others else float("inf")


def record_flags(session: Session, experiment: Experiment, flags: list[Flag], now: datetime) -> list[str]:
    """Store the flags not seen before; returns the usernames that reached ``auto_remove_flags`` (removed here)."""
    if not flags:
        return []
    known = set(
        session.scalars(
            select(SwarmFlag.event_id).where(
                SwarmFlag.experiment_id == experiment.id, SwarmFlag.event_id.in_([f.id for f in flags])
            )
        )
    )
    fresh = [f for f in {f.id: f for f in flags}.values() if f.id not in known]
    names = {f.username for f in fresh}
    users = dict(session.execute(select(User.username, User.id).where(User.username.in_(names))).tuples().all())
    contributions.experiment_totals(session, experiment.id)
    rows = contributions.volunteer_totals(session, experiment.id, set(users.values()))
    for flag in fresh:
        user_id = users.get(flag.username)
        if user_id is None:
            continue
        session.add(
            SwarmFlag(
                experiment_id=experiment.id,
                user_id=user_id,
                peer_id=flag.peer_id,
                reason=flag.reason,
                event_id=flag.id,
                count=flag.count,
                flagged_at=now,
            )
        )
        rows[user_id].swarm_flags = (rows[user_id].swarm_flags or 0) + flag.count
    session.flush()
    limit = experiment.auto_remove_flags or 0
    if limit <= 0:
        return []
    from swarmhub.server import experiments

    removed = []
    for username, user_id in users.items():
        if (rows[user_id].swarm_flags or 0) >= limit and user_id != experiment.owner_id:
            user = session.get(User, user_id)
            if user is not None and not experiments.is_banned(session, experiment, user):
                experiments.ban(session, experiment, username)
                removed.append(username)
                logger.warning("removed %s from %s after %d flags", username, experiment.slug, limit)
    return removed


def flag_reasons(session: Session, experiment_id: int, user_ids: list[int]) -> dict[int, dict[str, int]]:
    """user ID -> reason -> times, for the organizer's view."""
    rows = session.execute(
        select(SwarmFlag.user_id, SwarmFlag.reason, func.sum(SwarmFlag.count))
        .where(SwarmFlag.experiment_id == experiment_id, SwarmFlag.user_id.in_(user_ids))
        .group_by(SwarmFlag.user_id, SwarmFlag.reason)
    ).all()
    result: dict[int, dict[str, int]] = {}
    for user_id, reason, count in rows:
        result.setdefault(user_id, {})[reason] = int(count)
    return result
