"""Metric ingestion and what dashboards show: summary, loss/throughput series and the leaderboard."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.worker.protocol import MetricReport

from . import contributions
from .models import Experiment, MetricPoint, User, WorkerRun, utcnow

SERIES_POINTS = 300  # at most this many buckets per series
SERIES_WINDOW = 20_000  # newest reports considered for the series


class LeaderboardEntry(BaseModel):
    rank: int
    username: str
    samples: int = Field(description="Verified: in the swarm's signed records, in epochs the swarm has closed")
    pending_samples: int = Field(description="In signed records of the epoch still open")
    claimed_samples: int = Field(description="What the volunteer's workers reported over the websocket")
    share: float = Field(description="Fraction of all verified samples of the run")
    samples_per_second: float
    time_online_seconds: float = Field(description="Time the swarm saw this volunteer's peers publish records")
    active: bool
    last_seen: datetime | None
    flags: list[str] | None = Field(
        default=None, description="Implausible claims, for the experiment's organizer only (null for others)"
    )


class SeriesPoint(BaseModel):
    t: float  # unix time (server clock) of the bucket start
    loss: float
    samples_per_second: float
    peers: int


class Summary(BaseModel):
    status: str
    active_peers: int
    total_samples: int  # claimed: what the workers reported
    verified_samples: int  # in the swarm's signed records, in closed epochs
    samples_per_second: float
    epoch: int
    loss: float | None
    swarm_peers: int | None  # what the server's own peer sees in the DHT, when it runs


class MetricsPublic(BaseModel):
    summary: Summary
    series: list[SeriesPoint]


def ingest(session: Session, worker: WorkerRun, report: MetricReport) -> bool:
    """Store one report exactly once. Returns False for a duplicate (already stored) message."""
    values: dict[str, Any] = {
        "experiment_id": worker.experiment_id,
        "worker_run_id": worker.id,
        "received_at": utcnow(),
        **report.model_dump(exclude={"type"}),
    }
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    stmt = (
        insert(MetricPoint)
        .values(**values)
        .on_conflict_do_nothing(index_elements=["worker_run_id", "seq"])
        .returning(MetricPoint.id)
    )
    inserted = session.execute(stmt).scalar_one_or_none() is not None
    if inserted and report.seq > worker.last_seq:
        worker.last_seq = report.seq
        worker.samples = report.samples
        worker.epoch = report.epoch
        worker.loss = report.loss
        worker.samples_per_second = report.samples_per_second
    worker.last_seen_at = values["received_at"]
    session.flush()
    return inserted


def _active_since(window_seconds: int) -> datetime:
    return utcnow() - timedelta(seconds=window_seconds)


# A claim is implausible when it is this far above what the swarm's signed records show.
CLAIM_SLACK = 0.25  # claimed samples over verified + pending, beyond the reporting lag
THROUGHPUT_FACTOR = 3.0  # claimed peak rate over the fastest signed rate of the same device class


def device_class(device: str) -> str:
    return device.split(":", 1)[0].lower() or "cpu"


def leaderboard(
    session: Session, experiment: Experiment, window_seconds: int, *, with_flags: bool = False
) -> list[LeaderboardEntry]:
    """Volunteers by verified samples, with what they claimed beside it; ``with_flags`` adds the organizer's
    view of implausible claims."""
    since = _active_since(window_seconds)
    rows = session.execute(
        select(
            WorkerRun.user_id,
            User.username,
            WorkerRun.samples,
            WorkerRun.samples_per_second,
            WorkerRun.last_seen_at,
            WorkerRun.device,
        )
        .join(User, User.id == WorkerRun.user_id)
        .where(WorkerRun.experiment_id == experiment.id)
    ).all()
    per_user: dict[int, dict[str, Any]] = {}

    def entry_for(user_id: int, username: str) -> dict[str, Any]:
        return per_user.setdefault(
            user_id,
            {"username": username, "claimed": 0, "sps": 0.0, "last_seen": None, "classes": set()},
        )

    for user_id, username, samples, sps, last_seen, device in rows:
        entry = entry_for(user_id, username)
        entry["classes"].add(device_class(device))
        if last_seen is None:
            continue
        entry["claimed"] += samples
        if last_seen >= since:
            entry["sps"] += sps
        if entry["last_seen"] is None or last_seen > entry["last_seen"]:
            entry["last_seen"] = last_seen
    verified = contributions.by_user(session, experiment)
    if verified:
        names = dict(session.execute(select(User.id, User.username).where(User.id.in_(verified))).tuples().all())
        for user_id, v in verified.items():
            entry = entry_for(user_id, names[user_id])
            if v.last_seen is not None and (entry["last_seen"] is None or v.last_seen > entry["last_seen"]):
                entry["last_seen"] = v.last_seen
    per_user = {uid: e for uid, e in per_user.items() if e["last_seen"] is not None}
    total_verified = sum(v.samples for v in verified.values())
    flags = _flags(session, experiment, per_user, verified) if with_flags else {}
    ranked = sorted(
        per_user.items(),
        key=lambda item: (
            -verified.get(item[0], contributions.Verified()).samples,
            -item[1]["claimed"],
            item[1]["username"].lower(),
        ),
    )
    board = []
    for rank, (user_id, e) in enumerate(ranked, start=1):
        v = verified.get(user_id, contributions.Verified())
        board.append(
            LeaderboardEntry(
                rank=rank,
                username=e["username"],
                samples=v.samples,
                pending_samples=v.pending,
                claimed_samples=e["claimed"],
                share=round(v.samples / total_verified, 4) if total_verified else 0.0,
                samples_per_second=round(e["sps"], 2),
                time_online_seconds=round(v.online_seconds, 1),
                active=e["last_seen"] >= since,
                last_seen=e["last_seen"],
                flags=flags.get(user_id, []) if with_flags else None,
            )
        )
    return board


def _flags(
    session: Session,
    experiment: Experiment,
    per_user: dict[int, dict[str, Any]],
    verified: dict[int, contributions.Verified],
) -> dict[int, list[str]]:
    """Claims the signed records do not back: samples that never reached an averaging round, and a
    reported rate far above what peers of the same device class were seen to do in this experiment."""
    peaks = dict(
        session.execute(
            select(WorkerRun.user_id, func.max(MetricPoint.samples_per_second))
            .join(MetricPoint, MetricPoint.worker_run_id == WorkerRun.id)
            .where(WorkerRun.experiment_id == experiment.id)
            .group_by(WorkerRun.user_id)
        )
        .tuples()
        .all()
    )
    fastest_signed: dict[str, float] = defaultdict(float)  # device class -> best signed rate
    for user_id, e in per_user.items():
        signed = verified.get(user_id, contributions.Verified()).peak_samples_per_second
        for cls in e["classes"]:
            fastest_signed[cls] = max(fastest_signed[cls], signed)
    flags: dict[int, list[str]] = {}
    for user_id, e in per_user.items():
        v = verified.get(user_id, contributions.Verified())
        mine = []
        backed = v.samples + v.pending
        # What the monitor cannot have seen: each epoch's last moments at the peer's rate, plus reporting lag.
        unseen = v.epochs * contributions.MONITOR_SECONDS * v.peak_samples_per_second
        if e["claimed"] > backed * (1 + CLAIM_SLACK) + unseen + 2 * experiment.target_batch_size:
            mine.append(
                f"claims {e['claimed']:,} samples but the swarm's signed records show {backed:,}: "
                "the rest never reached an averaging round"
            )
        peak = peaks.get(user_id) or 0.0
        for cls in sorted(e["classes"]):
            reference = fastest_signed[cls]
            if reference > 0 and peak > THROUGHPUT_FACTOR * reference:
                mine.append(
                    f"reported {peak:,.0f} samples/s; the fastest signed rate of a {cls} peer here is {reference:,.0f}"
                )
        if mine:
            flags[user_id] = mine
    return flags


def summary(session: Session, experiment: Experiment, window_seconds: int, swarm_peers: int | None = None) -> Summary:
    since = _active_since(window_seconds)
    total, epoch = session.execute(
        select(func.coalesce(func.sum(WorkerRun.samples), 0), func.coalesce(func.max(WorkerRun.epoch), 0)).where(
            WorkerRun.experiment_id == experiment.id
        )
    ).one()
    active = session.execute(
        select(WorkerRun.samples_per_second, WorkerRun.loss).where(
            WorkerRun.experiment_id == experiment.id, WorkerRun.last_seen_at >= since
        )
    ).all()
    losses = [loss for _, loss in active if loss is not None]
    return Summary(
        status=experiment.status,
        active_peers=len(active),
        total_samples=int(total),
        verified_samples=sum(v.samples for v in contributions.by_user(session, experiment).values()),
        samples_per_second=round(sum(sps for sps, _ in active), 2),
        epoch=int(epoch),
        loss=round(sum(losses) / len(losses), 6) if losses else None,
        swarm_peers=swarm_peers,
    )


def series(session: Session, experiment: Experiment) -> list[SeriesPoint]:
    """Loss (mean over workers), swarm throughput (sum of each worker's latest) and reporting peers,
    in at most SERIES_POINTS time buckets over the newest SERIES_WINDOW reports."""
    rows = list(
        session.execute(
            select(MetricPoint.received_at, MetricPoint.worker_run_id, MetricPoint.loss, MetricPoint.samples_per_second)
            .where(MetricPoint.experiment_id == experiment.id)
            .order_by(MetricPoint.received_at.desc(), MetricPoint.id.desc())
            .limit(SERIES_WINDOW)
        ).all()
    )
    if not rows:
        return []
    rows.reverse()
    start, end = rows[0][0].timestamp(), rows[-1][0].timestamp()
    width = max(1.0, (end - start) / SERIES_POINTS)
    buckets: dict[int, dict[str, Any]] = defaultdict(lambda: {"losses": [], "sps": {}})
    for received_at, worker_id, loss, sps in rows:
        bucket = buckets[int((received_at.timestamp() - start) // width)]
        bucket["losses"].append(loss)
        bucket["sps"][worker_id] = sps  # rows are in time order: the latest report per worker wins
    return [
        SeriesPoint(
            t=round(start + index * width, 3),
            loss=round(sum(b["losses"]) / len(b["losses"]), 6),
            samples_per_second=round(sum(b["sps"].values()), 2),
            peers=len(b["sps"]),
        )
        for index, b in sorted(buckets.items())
    ]
