"""What the dashboard shows beside the leaderboard: the experiment's summary (running totals and the active
workers) and its loss/throughput series, read from the time buckets the write path keeps."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, Integer, Select, bindparam, func, select
from sqlalchemy.orm import Session

from swarmhub.server.metrics.common import (
    BUCKET_WIDTHS,
    BUCKETS_TABLE,
    RUNS_TABLE,
    TOTALS_TABLE,
    active_since,
    current_time,
)
from swarmhub.server.models import Experiment

SERIES_POINTS = 300  # at most this many buckets per series


class SeriesPoint(BaseModel):
    """One time bucket of the dashboard's chart: ``loss`` is the mean over the reports stored in it,
    ``samples_per_second`` the samples the swarm's worker runs added in it (each accepted report's count over its
    run's previous one) over the bucket's width, and ``peers`` the worker runs that reported in it."""

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


class Baseline(BaseModel):
    """What a model that knows only how often each label occurs scores: the reference a trained model must beat,
    drawn on the dashboard's loss chart. For a task with a held-out set (albert-mlm: the unigram model of the
    training shards on the held-out masked positions) it is measured where the checkpoints' held-out loss is;
    otherwise (digits: the class prior) on the data the training loss is measured on."""

    label: str = Field(description="What the baseline model knows, as the dashboard's reference line says")
    measured_on: Literal["held-out", "training"] = Field(description="The loss it compares with")
    loss: float = Field(description="Its cross-entropy in nats, comparable with the loss")
    top1: float | None = Field(description="Share of labels it predicts right: the most frequent label's share")
    top5: float | None = Field(description="Share of labels among its five most frequent")


class MetricsPublic(BaseModel):
    summary: Summary
    series: list[SeriesPoint]
    baseline: Baseline | None = None


def _summary_statement() -> Select[Any]:
    run, totals = RUNS_TABLE.c, TOTALS_TABLE.c
    experiment_id = bindparam("experiment_id", type_=Integer)
    active = (
        select(
            func.count().label("active"),
            func.coalesce(func.sum(run.samples_per_second), 0.0).label("rate"),
            func.coalesce(func.sum(run.loss), 0.0).label("loss_sum"),
            func.count(run.loss).label("losses"),
        )
        .where(run.experiment_id == experiment_id, run.last_seen_at >= bindparam("since"))
        .subquery()
    )
    # the active runs' sums (one row), and the experiment's totals beside them where there are any yet
    return select(active, totals.claimed_samples, totals.verified_samples, totals.worker_epoch).select_from(
        active.outerjoin(TOTALS_TABLE, totals.experiment_id == experiment_id)
    )


_SUMMARY = _summary_statement()


def summary(session: Session, experiment: Experiment, window_seconds: int, swarm_peers: int | None = None) -> Summary:
    """The experiment's running totals, and the workers that reported within the window (an index range), in
    one statement."""
    row = session.execute(_SUMMARY, {"experiment_id": experiment.id, "since": active_since(window_seconds)}).one()
    return Summary(
        status=experiment.status,
        active_peers=int(row.active),
        total_samples=row.claimed_samples or 0,
        verified_samples=row.verified_samples or 0,
        samples_per_second=round(float(row.rate), 2),
        epoch=row.worker_epoch or 0,
        loss=round(float(row.loss_sum or 0.0) / int(row.losses), 6) if row.losses else None,
        swarm_peers=swarm_peers,
    )


def _series_statements() -> tuple[Select[Any], Select[Any]]:
    bucket = BUCKETS_TABLE.c
    experiment_id = bindparam("experiment_id", type_=Integer)
    # each resolution's first and last bucket: four index probes of the primary key, in one statement
    span = select(
        *(
            select(edge(bucket.bucket_start))
            .where(bucket.experiment_id == experiment_id, bucket.width == width)
            .scalar_subquery()
            for width in BUCKET_WIDTHS
            for edge in (func.min, func.max)
        )
    )
    newest = (
        select(bucket.bucket_start, bucket.loss_sum, bucket.reports, bucket.samples, bucket.peers)
        .where(
            bucket.experiment_id == experiment_id,
            bucket.width == bindparam("width", type_=Integer),
            bucket.bucket_start > bindparam("start", type_=BigInteger),
        )
        .order_by(bucket.bucket_start)
    )
    return span, newest


# Built once, values bound; rows read as plain tuples, not as 300 mapped objects
_SERIES_SPAN, _SERIES_BUCKETS = _series_statements()


def series(session: Session, experiment: Experiment, now: datetime | None = None) -> list[SeriesPoint]:
    """The newest SERIES_POINTS buckets of the finest resolution (BUCKET_WIDTHS) that shows the whole run, or of
    the coarsest one when none does (so a run longer than SERIES_POINTS coarse buckets shows its newest part).
    Reads the buckets ``ingest`` keeps (``MetricBucket``): the resolutions' spans (index probes), then at most
    SERIES_POINTS rows. ``now`` (the server clock) is where the newest bucket's elapsed part ends."""
    edges = session.execute(_SERIES_SPAN, {"experiment_id": experiment.id}).one()
    for i, width in enumerate(BUCKET_WIDTHS):
        first, last = edges[2 * i], edges[2 * i + 1]
        if last is None:
            return []
        if last - first < SERIES_POINTS * width:
            break
    rows = session.execute(
        _SERIES_BUCKETS, {"experiment_id": experiment.id, "width": width, "start": last - SERIES_POINTS * width}
    ).all()
    clock = (now or current_time()).timestamp()
    return [
        SeriesPoint(
            t=float(start),
            loss=round(loss_sum / reports, 6),
            # A bucket still filling is divided by its elapsed part (at least a second), not its whole width.
            samples_per_second=round(samples / min(width, max(1.0, clock - start)), 2),
            peers=peers,
        )
        for start, loss_sum, reports, samples, peers in rows
    ]
