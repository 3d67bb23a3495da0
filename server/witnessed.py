"""Verified work: the averaging rounds that the server's auxiliary peer witnessed, and what its peers flagged.

The server's auxiliary peer takes part in every gradient averaging round as a reducer and publishes, for each
round it saw complete, the senders and the weight each counted for in the average (``worker/witness.py``); the
monitor peer reads that record and attributes each sender through the roster. This module keeps the ledger:

- ``witnessed_rounds`` (one row per round, by hivemind's group ID: a round read twice counts once) and
  ``round_credits`` (per sender: its weight and the samples credited);
- ``swarm_flags``: what the server's peers refused from a volunteer's peer, and the organizer's automatic
  removal after ``auto_remove_flags`` of them.

What a sender is credited for a round is its weight there, which the reducers already capped (at the target
batch, and at twice the round's median claim with three senders or more), and at most RATE_FACTOR times what
the fastest other volunteer of its device class was credited per second, times the time since this peer's
previous witnessed round (``_rate_bound``). A peer that publishes records, claims a huge batch or a made-up rate
gains nothing beyond that: only rounds in which the server's peer received a full, finite slice from it count.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from . import contributions
from .models import Experiment, RoundCredit, SwarmFlag, SwarmPeer, User, WitnessedRound

logger = logging.getLogger("swarmhub.witnessed")

# A peer's first witnessed round is credited for at most this long before it (the time since its first record).
FIRST_ROUND_SECONDS = 120.0
# And any round for at most this long since the peer's previous one: a peer away for an hour gains no hour's work.
MAX_ROUND_GAP = 600.0
# A peer is credited per second at most this many times the fastest other volunteer of its device class: honest
# devices of one class can differ several times over (a laptop and a workstation are both "cpu"; the organizer's
# flags use the same margin), a made-up rate by orders of magnitude. In rounds of three senders or more the
# reducers' cap (twice the median claim) is the tighter bound; this one holds in the smallest swarms too.
RATE_FACTOR = 10.0


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
    rows = contributions.volunteer_totals(session, experiment.id, set(users.values()))
    peaks = {cls: [list(p) for p in entries] for cls, entries in (totals.witnessed_peaks or {}).items()}
    for item in fresh:
        at = datetime.fromtimestamp(min(item.time, now.timestamp()), timezone.utc)
        row = WitnessedRound(experiment_id=experiment.id, round_id=item.id, epoch=item.epoch, witnessed_at=at)
        session.add(row)
        session.flush()
        for sender in item.senders:
            user_id = users.get(sender.username)
            if user_id is None:
                continue
            peer = session.scalar(
                select(SwarmPeer).where(SwarmPeer.experiment_id == experiment.id, SwarmPeer.peer_id == sender.peer_id)
            )
            since = _since(peer, at)
            classes = sorted(rows[user_id].device_classes or []) or ["cpu"]
            credited = int(min(sender.weight, _rate_bound(peaks, classes, user_id) * since))
            session.add(
                RoundCredit(
                    round_pk=row.id,
                    experiment_id=experiment.id,
                    user_id=user_id,
                    peer_id=sender.peer_id,
                    weight=sender.weight,
                    credited=credited,
                )
            )
            if peer is not None:
                peer.last_round_at = at
            rows[user_id].verified_samples += credited
            totals.verified_samples += credited
            if credited > 0 and since > 0:
                _raise_peaks(peaks, classes, credited / since, user_id)
    totals.witnessed_peaks = peaks  # a new dict: JSON columns see assignment, not mutation
    session.flush()
    return len(fresh)


def _since(peer: SwarmPeer | None, at: datetime) -> float:
    """The seconds of work a round can stand for: since the peer's previous witnessed round, or since its first
    record (at most FIRST_ROUND_SECONDS), never more than MAX_ROUND_GAP; none before its first record."""
    if peer is None:
        return 0.0  # a round read before the peer's first record: nothing to measure its time by
    if peer.last_round_at is not None:
        return max(0.0, min((at - peer.last_round_at).total_seconds(), MAX_ROUND_GAP))
    return max(0.0, min((at - peer.first_seen).total_seconds(), FIRST_ROUND_SECONDS))


def _rate_bound(peaks: dict[str, list[list[float]]], classes: list[str], user_id: int) -> float:
    """The fastest credited rate of another volunteer of one of ``classes`` (of any class when none has one);
    unbounded when no other volunteer has been credited yet (the first volunteer of an experiment is bounded by
    the reducers' weight caps only)."""

    def others(entries: list[list[float]]) -> float:
        return max((rate for rate, uid in entries if int(uid) != user_id), default=0.0)

    of_class = [others(peaks.get(cls, [])) for cls in classes]
    best = max(of_class, default=0.0)
    if best <= 0:
        best = max((others(entries) for entries in peaks.values()), default=0.0)
    return RATE_FACTOR * best if best > 0 else float("inf")


def _raise_peaks(peaks: dict[str, list[list[float]]], classes: list[str], rate: float, user_id: int) -> None:
    """Keep, per class, the two fastest rates of different volunteers (one to bound everyone but its holder)."""
    for cls in classes:
        entries = {int(uid): r for r, uid in peaks.get(cls, [])}
        entries[user_id] = max(entries.get(user_id, 0.0), rate)
        top = sorted(entries.items(), key=lambda item: -item[1])[:2]
        peaks[cls] = [[r, uid] for uid, r in top]


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
    from . import experiments

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
