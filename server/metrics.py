"""Metric ingestion and what dashboards show: summary, loss/throughput series and the leaderboard."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.worker.protocol import MetricReport

from .models import Experiment, MetricPoint, User, WorkerRun, utcnow

SERIES_POINTS = 300  # at most this many buckets per series
SERIES_WINDOW = 20_000  # newest reports considered for the series


class LeaderboardEntry(BaseModel):
    rank: int
    username: str
    samples: int
    samples_per_second: float
    active: bool
    last_seen: datetime | None


class SeriesPoint(BaseModel):
    t: float  # unix time (server clock) of the bucket start
    loss: float
    samples_per_second: float
    peers: int


class Summary(BaseModel):
    status: str
    active_peers: int
    total_samples: int
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


def leaderboard(session: Session, experiment: Experiment, window_seconds: int) -> list[LeaderboardEntry]:
    since = _active_since(window_seconds)
    rows = session.execute(
        select(
            WorkerRun.user_id, User.username, WorkerRun.samples, WorkerRun.samples_per_second, WorkerRun.last_seen_at
        )
        .join(User, User.id == WorkerRun.user_id)
        .where(WorkerRun.experiment_id == experiment.id, WorkerRun.last_seen_at.is_not(None))
    ).all()
    per_user: dict[int, dict[str, Any]] = {}
    for user_id, username, samples, sps, last_seen in rows:
        entry = per_user.setdefault(
            user_id, {"username": username, "samples": 0, "samples_per_second": 0.0, "last_seen": None}
        )
        entry["samples"] += samples
        if last_seen is not None and last_seen >= since:
            entry["samples_per_second"] += sps
        if entry["last_seen"] is None or (last_seen and last_seen > entry["last_seen"]):
            entry["last_seen"] = last_seen
    ranked = sorted(per_user.values(), key=lambda e: (-e["samples"], e["username"].lower()))
    return [
        LeaderboardEntry(
            rank=i + 1,
            username=e["username"],
            samples=e["samples"],
            samples_per_second=round(e["samples_per_second"], 2),
            active=e["last_seen"] is not None and e["last_seen"] >= since,
            last_seen=e["last_seen"],
        )
        for i, e in enumerate(ranked)
    ]


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
