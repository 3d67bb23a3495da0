"""Verified contributions: what each volunteer's peer did, as the swarm's signed records show it.

The experiment's monitor peer (``swarm/bootstrap_peer.py``) reads every peer's ``{run_id}_progress`` record about once a
second. hivemind signs each record with the peer's key (its ``[owner:...]`` subkey), and the monitor credits a
record to a volunteer only when that key is the one in a valid access token on the run's roster, a token the
server signed for that volunteer. This module keeps the ledger those observations feed:

- ``swarm_peers``: per peer, when it was first and last seen, its time online (the time between fresh records,
  gaps of more than ``PRESENCE_GAP`` seconds not counted) and the fastest rate its records showed;
- ``peer_epochs``: per peer and swarm epoch, the largest sample count its records showed, at most twice the
  collaborative batch (``target_batch_size``).

A peer's samples in the swarm's open epoch are *pending*: what its records claim, which no one has checked. They
become *verified* only through ``witnessed.record_rounds``: when the server's auxiliary peer saw the peer take
part in a completed averaging round, with the weight it counted for there. When the swarm moves past an epoch,
its pending samples are dropped (whatever was real was credited through the rounds).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.server.models import Experiment, ExperimentTotal, PeerEpoch, RoundCredit, SwarmPeer, User, VolunteerTotal

logger = logging.getLogger("swarmhub.contributions")

# How often the monitor peer reads the records (``bootstrap_peer --interval``). What a peer adds in its last
# moments of an epoch, after the monitor's last read of it, is not seen: at most this long at its rate.
MONITOR_SECONDS = 1.0
# A peer keeps accumulating until it notices the swarm reached its batch: its count for an epoch can pass
# ``target_batch_size``, but an honest one does not reach twice it.
EPOCH_CAP = 2

# A live peer re-publishes its record at least every 30 s (hivemind: metadata_expiration / 2), and on every
# step while it trains: a longer silence means it was away, and that time is not counted as online.
PRESENCE_GAP = 45.0


class Contribution(BaseModel):
    """One attributed progress record, as the monitor peer reports it."""

    peer_id: str = Field(min_length=1, max_length=64)
    username: str = Field(min_length=1, max_length=64)
    epoch: int = Field(ge=0, le=2**53)
    samples: int = Field(ge=0, le=2**53)
    samples_per_second: float = Field(ge=0.0, allow_inf_nan=False)
    time: float = Field(allow_inf_nan=False)


def parse(contributors: Any) -> list[Contribution]:
    parsed = []
    for item in contributors if isinstance(contributors, list) else []:
        try:
            parsed.append(Contribution.model_validate(item))
        except ValidationError:
            logger.warning("ignoring a malformed contribution record: %.200r", item)
    return parsed


def record(session: Session, experiment: Experiment, contributors: list[Contribution], now: datetime) -> None:
    """Add one read of the swarm's progress records to the ledger, and to the running totals beside it
    (``VolunteerTotal``, ``ExperimentTotal``) in the same transaction."""
    names = {c.username for c in contributors}
    users = dict(session.execute(select(User.username, User.id).where(User.username.in_(names))).tuples().all())
    credited = [(c, users[c.username]) for c in contributors if c.username in users]
    if not credited:  # only tokens for accounts that no longer exist
        return
    totals = experiment_totals(session, experiment.id)  # locked: ingests and reads of the ledger take turns
    open_epoch = max(c.epoch for c, _ in credited)
    if totals.max_epoch is not None and totals.max_epoch >= open_epoch:
        open_epoch = totals.max_epoch
    elif totals.max_epoch is not None:
        _close_open_epoch(session, experiment.id, totals)
    totals.max_epoch = open_epoch
    changes: dict[int, _Change] = defaultdict(_Change)
    moved: set[int] = set()  # users whose peer was credited to someone else before
    for c, user_id in credited:
        fresh = now.timestamp() - c.time <= PRESENCE_GAP  # the record was written recently: the peer is there
        peer = session.scalar(
            select(SwarmPeer).where(SwarmPeer.experiment_id == experiment.id, SwarmPeer.peer_id == c.peer_id)
        )
        if peer is None:
            peer = SwarmPeer(
                experiment_id=experiment.id,
                user_id=user_id,
                peer_id=c.peer_id,
                first_seen=now,
                last_seen=now if fresh else datetime.fromtimestamp(min(c.time, now.timestamp()), timezone.utc),
                online_seconds=0.0,
                record_time=c.time,
                peak_samples_per_second=c.samples_per_second,
            )
            session.add(peer)
            changes[user_id].saw(peer.last_seen, peer.peak_samples_per_second)
        elif c.time > peer.record_time and fresh:
            if peer.user_id != user_id:
                moved |= {peer.user_id, user_id}
            gap = (now - peer.last_seen).total_seconds()
            if 0 < gap <= PRESENCE_GAP:
                peer.online_seconds += gap
                changes[user_id].online_seconds += gap
            peer.last_seen = now
            peer.record_time = c.time
            peer.user_id = user_id
            peer.peak_samples_per_second = max(peer.peak_samples_per_second, c.samples_per_second)
            changes[user_id].saw(now, peer.peak_samples_per_second)
        samples = min(c.samples, EPOCH_CAP * experiment.target_batch_size)
        row = session.scalar(
            select(PeerEpoch).where(
                PeerEpoch.experiment_id == experiment.id, PeerEpoch.peer_id == c.peer_id, PeerEpoch.epoch == c.epoch
            )
        )
        if row is None:
            row = PeerEpoch(
                experiment_id=experiment.id, user_id=user_id, peer_id=c.peer_id, epoch=c.epoch, samples=samples
            )
            session.add(row)
            changes[user_id].epochs += 1
            added = samples
        else:
            added = max(0, samples - row.samples)
            row.samples += added
        # The open epoch's samples are pending; a late read of a closed epoch adds nothing (the rounds credit it).
        if row.epoch >= open_epoch:
            changes[row.user_id].pending += added
    session.flush()
    _apply(session, experiment.id, totals, changes, moved)


@dataclass
class _Change:
    """What one read of the records adds to one volunteer's totals."""

    pending: int = 0
    epochs: int = 0
    online_seconds: float = 0.0
    last_seen: datetime | None = None
    peak_samples_per_second: float = 0.0

    def saw(self, at: datetime, peak: float) -> None:
        self.last_seen = at if self.last_seen is None else max(self.last_seen, at)
        self.peak_samples_per_second = max(self.peak_samples_per_second, peak)


def experiment_totals(session: Session, experiment_id: int) -> ExperimentTotal:
    """The experiment's running totals, locked (``FOR UPDATE``) until the transaction ends: everything that
    changes totals takes this lock first, so updates of one experiment's totals never interleave."""
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = select(ExperimentTotal).where(ExperimentTotal.experiment_id == experiment_id)
    stmt = stmt.with_for_update().execution_options(populate_existing=True)
    totals = session.scalar(stmt)
    if totals is None:
        session.execute(insert(ExperimentTotal).values(experiment_id=experiment_id).on_conflict_do_nothing())
        totals = session.scalars(stmt).one()
    return totals


def volunteer_totals(session: Session, experiment_id: int, user_ids: set[int]) -> dict[int, VolunteerTotal]:
    """The given volunteers' totals rows in one experiment, created where missing. Call with the experiment's
    totals locked (``experiment_totals``)."""
    stmt = select(VolunteerTotal).where(
        VolunteerTotal.experiment_id == experiment_id, VolunteerTotal.user_id.in_(user_ids)
    )
    rows = {row.user_id: row for row in session.scalars(stmt)}
    missing = user_ids - rows.keys()
    if missing:
        for user_id, username in session.execute(select(User.id, User.username).where(User.id.in_(missing))):
            rows[user_id] = VolunteerTotal(
                experiment_id=experiment_id,
                user_id=user_id,
                sort_name=username.lower(),
                claimed_samples=0,
                peak_claimed_samples_per_second=0.0,
                device_classes=[],
                verified_samples=0,
                pending_samples=0,
                epochs=0,
                online_seconds=0.0,
                peak_signed_samples_per_second=0.0,
                swarm_flags=0,
            )
            session.add(rows[user_id])
    return rows


def _close_open_epoch(session: Session, experiment_id: int, totals: ExperimentTotal) -> None:
    """The swarm moved past its open epoch: its claims are no longer pending, for every volunteer at once."""
    session.execute(
        update(VolunteerTotal)
        .where(VolunteerTotal.experiment_id == experiment_id, VolunteerTotal.pending_samples > 0)
        .values(pending_samples=0)
        .execution_options(synchronize_session="fetch")
    )
    totals.pending_samples = 0


def _apply(
    session: Session, experiment_id: int, totals: ExperimentTotal, changes: dict[int, _Change], moved: set[int]
) -> None:
    rows = volunteer_totals(session, experiment_id, set(changes) | moved)
    for user_id, change in changes.items():
        row = rows[user_id]
        row.pending_samples += change.pending
        row.epochs += change.epochs
        row.online_seconds += change.online_seconds
        if change.last_seen is not None and (row.last_signed_at is None or change.last_seen > row.last_signed_at):
            row.last_signed_at = change.last_seen
        if change.peak_samples_per_second > row.peak_signed_samples_per_second:
            row.peak_signed_samples_per_second = change.peak_samples_per_second
            raise_class_peaks(totals, row.device_classes, row.peak_signed_samples_per_second)
        totals.pending_samples += change.pending
    if moved:  # a peer now signs for someone else (rare): its time and peaks are recounted from the ledger
        session.flush()
        peers = session.execute(
            select(
                SwarmPeer.user_id,
                func.sum(SwarmPeer.online_seconds),
                func.max(SwarmPeer.last_seen),
                func.max(SwarmPeer.peak_samples_per_second),
            )
            .where(SwarmPeer.experiment_id == experiment_id, SwarmPeer.user_id.in_(moved))
            .group_by(SwarmPeer.user_id)
        ).all()
        recount = {user_id: (online, last, peak) for user_id, online, last, peak in peers}
        for user_id in moved:
            online, last, peak = recount.get(user_id, (0.0, None, 0.0))
            rows[user_id].online_seconds = float(online)
            rows[user_id].last_signed_at = last
            rows[user_id].peak_signed_samples_per_second = float(peak)
            raise_class_peaks(totals, rows[user_id].device_classes, float(peak))
    session.flush()


def raise_class_peaks(totals: ExperimentTotal, classes: list[str], peak: float) -> None:
    peaks = dict(totals.signed_peaks)
    for cls in classes:
        peaks[cls] = max(peaks.get(cls, 0.0), peak)
    if peaks != totals.signed_peaks:
        totals.signed_peaks = peaks  # a new dict: JSON columns see assignment, not mutation


@dataclass
class Verified:
    samples: int = 0  # credited through witnessed rounds
    pending: int = 0  # in the epoch still open
    epochs: int = 0  # epochs with a record of theirs
    online_seconds: float = 0.0
    last_seen: datetime | None = None
    peak_samples_per_second: float = 0.0


def by_user(session: Session, experiment: Experiment) -> dict[int, Verified]:
    """Each volunteer's verified and pending samples, time online, last seen and fastest signed rate, recounted
    from the whole ledger (a scan: pages read ``VolunteerTotal``, which ``record`` keeps equal to this)."""
    result: dict[int, Verified] = {}
    open_epoch = session.scalar(select(func.max(PeerEpoch.epoch)).where(PeerEpoch.experiment_id == experiment.id))
    parts = ((True, PeerEpoch.epoch < open_epoch), (False, PeerEpoch.epoch == open_epoch))
    for closed, condition in parts if open_epoch is not None else ():
        rows = session.execute(
            select(PeerEpoch.user_id, func.sum(PeerEpoch.samples), func.count(PeerEpoch.id))
            .where(PeerEpoch.experiment_id == experiment.id, condition)
            .group_by(PeerEpoch.user_id)
        ).all()
        for user_id, samples, epochs in rows:
            entry = result.setdefault(user_id, Verified())
            entry.epochs += int(epochs)
            if not closed:
                entry.pending += int(samples)
    credits = session.execute(
        select(RoundCredit.user_id, func.sum(RoundCredit.credited))
        .where(RoundCredit.experiment_id == experiment.id)
        .group_by(RoundCredit.user_id)
    ).all()
    for user_id, credited in credits:
        result.setdefault(user_id, Verified()).samples += int(credited)
    peers = session.execute(
        select(
            SwarmPeer.user_id, SwarmPeer.online_seconds, SwarmPeer.last_seen, SwarmPeer.peak_samples_per_second
        ).where(SwarmPeer.experiment_id == experiment.id)
    ).all()
    for user_id, online, last_seen, peak in peers:
        entry = result.setdefault(user_id, Verified())
        entry.online_seconds += online
        entry.peak_samples_per_second = max(entry.peak_samples_per_second, peak)
        if entry.last_seen is None or last_seen > entry.last_seen:
            entry.last_seen = last_seen
    return result
