"""Verified contributions: what each volunteer's peer did, as the swarm's signed records show it.

The experiment's monitor peer (``swarm_peer.py``) reads every peer's ``{run_id}_progress`` record about once a
second. hivemind signs each record with the peer's key (its ``[owner:...]`` subkey), and the monitor credits a
record to a volunteer only when that key is the one in a valid access token on the run's roster, a token the
server signed for that volunteer. This module keeps the ledger those observations feed:

- ``swarm_peers``: per peer, when it was first and last seen, its time online (the time between fresh records,
  gaps of more than ``PRESENCE_GAP`` seconds not counted) and the fastest rate its records showed;
- ``peer_epochs``: per peer and swarm epoch, the largest sample count its records showed, at most twice the
  collaborative batch (``target_batch_size``).

A peer's samples of an epoch are *verified* once the swarm has moved past that epoch (the averaging round that
closed it has happened), and *pending* while the epoch is still open. Verified counts are a lower bound: the
samples a peer adds in the moment between the monitor's last read and the epoch's end are not seen.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .models import Experiment, PeerEpoch, SwarmPeer, User

logger = logging.getLogger("swarmhub.contributions")

# How often the monitor peer reads the records (``swarm_peer --interval``). What a peer adds in its last
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
    """Add one read of the swarm's progress records to the ledger."""
    names = {c.username for c in contributors}
    users = dict(session.execute(select(User.username, User.id).where(User.username.in_(names))).tuples().all())
    for c in contributors:
        user_id = users.get(c.username)
        if user_id is None:  # a token for an account that no longer exists
            continue
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
        elif c.time > peer.record_time and fresh:
            gap = (now - peer.last_seen).total_seconds()
            if 0 < gap <= PRESENCE_GAP:
                peer.online_seconds += gap
            peer.last_seen = now
            peer.record_time = c.time
            peer.user_id = user_id
            peer.peak_samples_per_second = max(peer.peak_samples_per_second, c.samples_per_second)
        samples = min(c.samples, EPOCH_CAP * experiment.target_batch_size)
        row = session.scalar(
            select(PeerEpoch).where(
                PeerEpoch.experiment_id == experiment.id, PeerEpoch.peer_id == c.peer_id, PeerEpoch.epoch == c.epoch
            )
        )
        if row is None:
            session.add(
                PeerEpoch(
                    experiment_id=experiment.id, user_id=user_id, peer_id=c.peer_id, epoch=c.epoch, samples=samples
                )
            )
        elif samples > row.samples:
            row.samples = samples
    session.flush()


@dataclass
class Verified:
    samples: int = 0  # in epochs the swarm has closed
    pending: int = 0  # in the epoch still open
    epochs: int = 0  # epochs with a record of theirs
    online_seconds: float = 0.0
    last_seen: datetime | None = None
    peak_samples_per_second: float = 0.0


def by_user(session: Session, experiment: Experiment) -> dict[int, Verified]:
    """Each volunteer's verified and pending samples, time online, last seen and fastest signed rate."""
    result: dict[int, Verified] = {}
    open_epoch = session.scalar(select(func.max(PeerEpoch.epoch)).where(PeerEpoch.experiment_id == experiment.id))
    if open_epoch is None:
        return result
    for closed, condition in ((True, PeerEpoch.epoch < open_epoch), (False, PeerEpoch.epoch == open_epoch)):
        rows = session.execute(
            select(PeerEpoch.user_id, func.sum(PeerEpoch.samples), func.count(PeerEpoch.id))
            .where(PeerEpoch.experiment_id == experiment.id, condition)
            .group_by(PeerEpoch.user_id)
        ).all()
        for user_id, samples, epochs in rows:
            entry = result.setdefault(user_id, Verified())
            entry.epochs += int(epochs)
            if closed:
                entry.samples += int(samples)
            else:
                entry.pending += int(samples)
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
