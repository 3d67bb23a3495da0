"""The organizer's view of an experiment's swarm: one row per volunteer's peer now in it, filled only from what the
server stores.

"Now in the swarm" is a peer whose signed progress records the experiment's monitor peer read within the active
window (``SwarmPeer.last_seen`` within ``active_window_seconds``), not one that merely holds a valid swarm token: a
token outlives the peer that asked for it by up to ``swarm_token_minutes``, and a peer that trains publishes records.

Per peer, from ``swarm_peers``: its peak samples/s in its signed records, its newest witnessed averaging round, and
from ``swarm_flags`` what the server's peers flagged of it. Per volunteer, since a worker run does not record its
peer's ID: the device classes and the samples/s that the volunteer's worker runs reported within the window.
Precision, client mode or reachability, the peer's role (auxiliary or trainer) and bandwidth are stored nowhere;
the page shows them as "—".
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .metrics.common import _active_since, current_time, device_class
from .models import Experiment, SwarmFlag, SwarmPeer, User, WorkerRun


class SwarmPeerRow(BaseModel):
    username: str
    peer_id: str = Field(description="libp2p's peer ID, as hivemind derives it from the peer's key")
    first_seen: datetime
    last_seen: datetime = Field(description="When the monitor peer last read one of its signed progress records")
    peak_samples_per_second: float = Field(description="The highest rate in its signed progress records")
    last_round_at: datetime | None = Field(description="Its newest averaging round the server's auxiliary peer saw")
    flags: dict[str, int] = Field(description="Reason -> times the server's peers refused something from it")
    devices: list[str] = Field(
        description="Device classes of the volunteer's worker runs that reported within the window (per volunteer: "
        "a worker run does not record its peer's ID)"
    )
    reported_samples_per_second: float = Field(
        description="The samples/s those worker runs reported, summed (per volunteer, as ``devices``)"
    )


class SwarmView(BaseModel):
    window_seconds: int = Field(description="A peer is in the swarm when the monitor read it within this window")
    generated_at: datetime
    peers: list[SwarmPeerRow]


def view(session: Session, experiment: Experiment, window_seconds: int) -> SwarmView:
    """The experiment's peers now in the swarm, by volunteer then peer ID; two statements whatever their number."""
    since = _active_since(window_seconds)
    flags = (
        select(SwarmFlag.peer_id, SwarmFlag.reason, func.sum(SwarmFlag.count).label("times"))
        .where(SwarmFlag.experiment_id == experiment.id)
        .group_by(SwarmFlag.peer_id, SwarmFlag.reason)
        .subquery()
    )
    # One row per (peer, flag reason): a peer without flags comes once, with no reason.
    rows = session.execute(
        select(SwarmPeer, User.username, flags.c.reason, flags.c.times)
        .join(User, User.id == SwarmPeer.user_id)
        .outerjoin(flags, flags.c.peer_id == SwarmPeer.peer_id)
        .where(SwarmPeer.experiment_id == experiment.id, SwarmPeer.last_seen >= since)
        .order_by(User.username, SwarmPeer.peer_id, flags.c.reason)
    ).all()
    runs = session.execute(
        select(WorkerRun.user_id, WorkerRun.device, WorkerRun.samples_per_second).where(
            WorkerRun.experiment_id == experiment.id, WorkerRun.last_seen_at >= since
        )
    ).all()
    devices: dict[int, set[str]] = {}
    rates: dict[int, float] = {}
    for user_id, device, rate in runs:
        devices.setdefault(user_id, set()).add(device_class(device))
        rates[user_id] = rates.get(user_id, 0.0) + (rate or 0.0)
    peers: dict[str, SwarmPeerRow] = {}
    for peer, username, reason, times in rows:
        row = peers.get(peer.peer_id)
        if row is None:
            row = peers[peer.peer_id] = SwarmPeerRow(
                username=username,
                peer_id=peer.peer_id,
                first_seen=peer.first_seen,
                last_seen=peer.last_seen,
                peak_samples_per_second=peer.peak_samples_per_second,
                last_round_at=peer.last_round_at,
                flags={},
                devices=sorted(devices.get(peer.user_id, ())),
                reported_samples_per_second=rates.get(peer.user_id, 0.0),
            )
        if reason is not None:
            row.flags[reason] = int(times)
    return SwarmView(window_seconds=window_seconds, generated_at=current_time(), peers=list(peers.values()))
