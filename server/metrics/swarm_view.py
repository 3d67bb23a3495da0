"""The organizer's view of an experiment's swarm: one row per volunteer's peer now in it, filled only from what the
server stores. It is diagnostic (who is in, on what, how fast, flagged for what), not a trust decision: what the
ledger credits comes from signed records and witnessed rounds, never from the self-reported figures shown here.

"Now in the swarm" is a peer whose signed progress records the experiment's monitor peer read within the active
window (``SwarmPeer.last_seen`` within ``active_window_seconds``), not one that merely holds a valid swarm token: a
token outlives the peer that asked for it by up to ``swarm_token_minutes``, and a peer that trains publishes records.

Per peer, from ``swarm_peers``: its peak samples/s in its signed records, its newest witnessed averaging round, and
from ``swarm_flags`` what the server's peers flagged of it.

Per peer too, from its worker run: the newest worker run whose ``peer_id`` is the peer's. The server derives that
peer ID at the join from the peer key the swarm token binds (never from a claim of the worker), so a run and a peer
match only when they hold the same key. From that run: the device class, and what the worker reported at the join
about how the peer takes part: its precision (fp32, bf16, fp16; none for an auxiliary peer), client mode or
reachable, its role (trainer or auxiliary) and its bandwidth to the server in Mbit/s. These are self-reported by the
worker and not verified: a modified worker can report anything. The reported samples/s is that run's, when it
reported within the window.

Runs started before the server recorded peer IDs (migration 0022), or by a worker whose run is not matched, fall
back to the volunteer: the device classes and summed samples/s of the volunteer's worker runs without a peer ID
that reported within the window (``run_match`` says which); their precision, client mode, role and bandwidth are
unknown, and the page shows them as "—".
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field
from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session, aliased

from swarmhub.server.metrics.common import active_since, current_time, device_class
from swarmhub.server.models import Experiment, SwarmFlag, SwarmPeer, User, WorkerRun
from swarmhub.server.swarm.supervision import PeerState


class SwarmPeerRow(BaseModel):
    username: str
    peer_id: str = Field(description="libp2p's peer ID, as hivemind derives it from the peer's key")
    first_seen: datetime
    last_seen: datetime = Field(description="When the monitor peer last read one of its signed progress records")
    peak_samples_per_second: float = Field(description="The highest rate in its signed progress records")
    last_round_at: datetime | None = Field(description="Its newest averaging round the server's auxiliary peer saw")
    flags: dict[str, int] = Field(description="Reason -> times the server's peers refused something from it")
    run_match: Literal["peer", "volunteer", "none"] = Field(
        description="Where the worker-run figures come from: 'peer', the newest worker run of this peer ID; "
        "'volunteer', the volunteer's worker runs without a peer ID that reported within the window (runs started "
        "before the server recorded peers); 'none', no such run"
    )
    devices: list[str] = Field(description="Device classes of the matched worker run(s) (see ``run_match``)")
    reported_samples_per_second: float = Field(
        description="The samples/s the matched worker run(s) reported within the window (summed per volunteer)"
    )
    precision: str | None = Field(
        description="Compute precision the worker reported at its join (fp32, bf16, fp16); self-reported"
    )
    client_mode: bool | None = Field(
        description="True: the worker joined in client mode (other peers cannot dial it); false: reachable; "
        "self-reported"
    )
    role: str | None = Field(description="trainer or auxiliary, as the worker reported at its join; self-reported")
    bandwidth_mbps: float | None = Field(
        description="The link speed to the server the worker measured before its join (Mbit/s); self-reported"
    )


class SwarmView(BaseModel):
    window_seconds: int = Field(description="A peer is in the swarm when the monitor read it within this window")
    generated_at: datetime
    peers: list[SwarmPeerRow]
    server_peers: list[PeerState] = Field(
        default_factory=list,
        description="The server's own peer processes for the experiment (monitor, witness, checkpoints): running or "
        "restarting, how often restarted, and the last error. A witness that is not running credits no one.",
    )


def view(
    session: Session, experiment: Experiment, window_seconds: int, server_peers: list[PeerState] | None = None
) -> SwarmView:
    """The experiment's peers now in the swarm, by volunteer then peer ID; two statements whatever their number.
    ``server_peers``: the server's own peer processes for it (``SwarmCoordinator.peer_states``)."""
    since = active_since(window_seconds)
    in_window = and_(SwarmPeer.experiment_id == experiment.id, SwarmPeer.last_seen >= since)
    flags = (
        select(SwarmFlag.peer_id, SwarmFlag.reason, func.sum(SwarmFlag.count).label("times"))
        .where(SwarmFlag.experiment_id == experiment.id)
        .group_by(SwarmFlag.peer_id, SwarmFlag.reason)
        .subquery()
    )
    newest = (  # each peer's newest worker run (a restarted worker keeps its key, so its peer ID)
        select(WorkerRun.peer_id, func.max(WorkerRun.created_at).label("created_at"))
        .where(
            WorkerRun.experiment_id == experiment.id, WorkerRun.peer_id.in_(select(SwarmPeer.peer_id).where(in_window))
        )
        .group_by(WorkerRun.peer_id)
        .subquery()
    )
    run = aliased(WorkerRun)
    # One row per (peer, flag reason): a peer without flags comes once, with no reason.
    rows = session.execute(
        select(SwarmPeer, User.username, run, flags.c.reason, flags.c.times)
        .join(User, User.id == SwarmPeer.user_id)
        .outerjoin(newest, newest.c.peer_id == SwarmPeer.peer_id)
        .outerjoin(
            run,
            and_(
                run.experiment_id == experiment.id,
                run.user_id == SwarmPeer.user_id,
                run.peer_id == newest.c.peer_id,
                run.created_at == newest.c.created_at,
            ),
        )
        .outerjoin(flags, flags.c.peer_id == SwarmPeer.peer_id)
        .where(in_window)
        .order_by(User.username, SwarmPeer.peer_id, flags.c.reason)
    ).all()
    # The fallback for peers without a run of their own: the volunteer's runs that recorded no peer.
    unmatched = session.execute(
        select(WorkerRun.user_id, WorkerRun.device, WorkerRun.samples_per_second).where(
            WorkerRun.experiment_id == experiment.id, WorkerRun.last_seen_at >= since, WorkerRun.peer_id.is_(None)
        )
    ).all()
    devices: dict[int, set[str]] = {}
    rates: dict[int, float] = {}
    for user_id, device, rate in unmatched:
        devices.setdefault(user_id, set()).add(device_class(device))
        rates[user_id] = rates.get(user_id, 0.0) + (rate or 0.0)
    peers: dict[str, SwarmPeerRow] = {}
    for peer, username, own, reason, times in rows:
        row = peers.get(peer.peer_id)
        if row is None:
            row = peers[peer.peer_id] = _row(peer, username, own, since, devices, rates)
        if reason is not None:
            row.flags[reason] = int(times)
    return SwarmView(
        window_seconds=window_seconds,
        generated_at=current_time(),
        peers=list(peers.values()),
        server_peers=server_peers or [],
    )


def _row(
    peer: SwarmPeer,
    username: str,
    run: WorkerRun | None,
    since: datetime,
    devices: dict[int, set[str]],
    rates: dict[int, float],
) -> SwarmPeerRow:
    """A peer's row: the worker-run figures from ``run``, its own newest run, or else from its volunteer's runs
    without a peer (``devices`` and ``rates`` by user ID)."""
    row = SwarmPeerRow(
        username=username,
        peer_id=peer.peer_id,
        first_seen=peer.first_seen,
        last_seen=peer.last_seen,
        peak_samples_per_second=peer.peak_samples_per_second,
        last_round_at=peer.last_round_at,
        flags={},
        run_match="none",
        devices=sorted(devices.get(peer.user_id, ())),
        reported_samples_per_second=rates.get(peer.user_id, 0.0),
        precision=None,
        client_mode=None,
        role=None,
        bandwidth_mbps=None,
    )
    if run is None:
        row.run_match = "volunteer" if row.devices else "none"
        return row
    reported = run.last_seen_at is not None and run.last_seen_at >= since
    row.run_match = "peer"
    row.devices = [device_class(run.device)]
    row.reported_samples_per_second = (run.samples_per_second or 0.0) if reported else 0.0
    row.precision, row.client_mode, row.role, row.bandwidth_mbps = (
        run.precision,
        run.client_mode,
        run.role,
        run.bandwidth_mbps,
    )
    return row
