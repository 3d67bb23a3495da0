"""The dashboard's series, kept per time bucket as reports arrive (``MetricBucket``), equals a from-scratch
computation over the stored reports with the same definitions, through duplicates, late reports and a run long
enough to switch to the coarse resolution. SQLite and PostgreSQL."""

from __future__ import annotations

import importlib.util
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select, text

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments, metrics
from swarmhub.server.models import Experiment, MetricBucket, MetricPoint, WorkerRun

from .conftest import make_experiment, make_user

pytestmark = pytest.mark.both_databases  # bucket upserts, per dialect

T0 = datetime(2026, 12, 1, 9, 0, 3, 250_000, tzinfo=timezone.utc)  # 3.25 s into a 10-second bucket


def from_scratch(session: Any, experiment_id: int, now: datetime) -> list[metrics.SeriesPoint]:
    """Every stored report in arrival order: a report whose seq is above its run's earlier ones adds its samples
    over the run's previous such report (the first: all), a late one adds none; loss is the mean over the
    bucket's reports; peers are the distinct runs. The finest resolution whose span fits SERIES_POINTS buckets
    (else the coarsest), its newest SERIES_POINTS buckets; the newest bucket divided by its elapsed part."""
    points = session.scalars(
        select(MetricPoint).where(MetricPoint.experiment_id == experiment_id).order_by(MetricPoint.id)
    ).all()
    if not points:
        return []
    last_seq: dict[str, int] = {}
    last_samples: dict[str, int] = {}
    added = []
    for p in points:
        if p.seq > last_seq.get(p.worker_run_id, -1):
            added.append(p.samples - last_samples.get(p.worker_run_id, 0))
            last_seq[p.worker_run_id], last_samples[p.worker_run_id] = p.seq, p.samples
        else:
            added.append(0)
    for width in metrics.BUCKET_WIDTHS:
        buckets: dict[int, dict[str, Any]] = defaultdict(lambda: {"losses": [], "samples": 0, "runs": set()})
        for p, a in zip(points, added, strict=True):
            b = buckets[int(p.received_at.timestamp()) // width * width]
            b["losses"].append(p.loss)
            b["samples"] += a
            b["runs"].add(p.worker_run_id)
        first, last = min(buckets), max(buckets)
        if last - first < metrics.SERIES_POINTS * width:
            break
    clock = now.timestamp()
    return [
        metrics.SeriesPoint(
            t=float(start),
            loss=round(sum(b["losses"]) / len(b["losses"]), 6),
            samples_per_second=round(b["samples"] / min(width, max(1.0, clock - start)), 2),
            peers=len(b["runs"]),
        )
        for start, b in sorted(buckets.items())
        if start > last - metrics.SERIES_POINTS * width
    ]


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = T0 + timedelta(seconds=seconds)


@pytest.fixture
def swarm(db, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(metrics.clock, "utcnow", clock)  # the server's clock: reports arrive when the test says
    organizer = make_user(db, "olga")
    ada = make_user(db, "ada")
    experiment = make_experiment(db, organizer, slug="curve", status="running")
    with db.begin() as session:
        exp = session.get(Experiment, experiment.id)
        workers = [
            experiments.start_worker_run(session, exp, session.merge(user), device).id
            for user, device in ((ada, "cpu"), (ada, "cuda:0"), (organizer, "cpu"))
        ]

    def report(worker: str, seconds: float, seq: int, samples: int, loss: float = 2.0) -> bool:
        clock.at(seconds)
        message = MetricReport(seq=seq, step=seq, epoch=1, samples=samples, loss=loss, samples_per_second=1.0, peers=3)
        with db.begin() as session:
            return metrics.ingest(session, session.get(WorkerRun, worker), message)

    def compare(seconds: float) -> list[metrics.SeriesPoint]:
        clock.at(seconds)
        with db() as session:
            exp = session.get(Experiment, experiment.id)
            got = metrics.series(session, exp, clock.now)
            assert got == from_scratch(session, experiment.id, clock.now)
            return got

    return report, compare, workers


def test_series_buckets_equal_a_recount_through_duplicates_late_reports_and_a_long_run(swarm):
    report, compare, (a, b, c) = swarm
    assert compare(0) == []
    for i in range(8):  # two runs every 4 s for 32 s; a third joins at 13 s
        assert report(a, 4 * i, i, 100 * (i + 1), loss=3.0 - i / 10)
        assert report(b, 4 * i + 1, i, 50 * (i + 1), loss=2.5)
        if i >= 3:
            assert report(c, 4 * i + 2, i - 3, 30 * (i - 2))
    # A re-sent message in a fresh bucket is not stored and counts for nothing; the run's next report, in the
    # same bucket, makes it a peer there.
    assert not report(a, 37, 3, 400)
    assert report(a, 38, 8, 900, loss=2.0)
    # An out-of-order pair: seq 20 then the older seq 15, which arrives alone in the next bucket.
    assert report(b, 39, 20, 700)
    assert report(b, 47, 15, 600, loss=1.0)
    points = compare(48.5)
    assert [p.t - points[0].t for p in points] == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    assert [p.peers for p in points] == [2, 3, 3, 3, 2, 1]
    newest = points[-1]  # only the late report: a peer and a loss, no samples
    assert (newest.peers, newest.loss, newest.samples_per_second) == (1, 1.0, 0.0)
    assert points[4].samples_per_second == (900 - 800 + 700 - 400) / 10  # the duplicate's bucket
    # Every sample the runs claim shows up once in the series (the newest bucket adds none).
    assert round(sum(p.samples_per_second * 10 for p in points)) == 900 + 700 + 30 * 5

    # Past SERIES_POINTS fine buckets the series switches to the coarse buckets.
    for minute in range(1, 70, 7):
        assert report(c, 60 * minute, 10 + minute, 150 + minute)
    assert report(a, 60 * 69 + 5, 9, 1000)
    points = compare(60 * 69 + 30)
    assert points[1].t - points[0].t == metrics.BUCKET_WIDTHS[-1]
    assert [p.peers for p in points] == [3] + [1] * 10  # the first five minutes, then one run at a time
    # The newest bucket (10:05, T0 + 3,896.75 s) is still filling: its 100 samples over its elapsed part.
    assert points[-1].samples_per_second == round(100 / (60 * 69 + 30 - 3896.75), 2)


def test_the_migration_backfills_the_same_buckets(swarm, db):
    report, compare, (a, b, c) = swarm
    for i in range(6):
        report(a, 7 * i, 2 * i, 10 * i, loss=1.0 + i)
        report(b, 3 * i + 400, i, 5 * i)
    assert not report(a, 50, 4, 20)  # duplicate
    assert report(a, 51, 3, 1)  # late
    report(c, 30, 0, 9)
    spec = importlib.util.spec_from_file_location(
        "backfill", Path(__file__).parent.parent / "migrations" / "versions" / "0009_metric_buckets.py"
    )
    assert spec is not None and spec.loader is not None
    migration = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(migration)

    def buckets(session: Any) -> list[tuple[Any, ...]]:
        rows = session.execute(
            select(MetricBucket.width, MetricBucket.bucket_start, MetricBucket.loss_sum, MetricBucket.reports,
                   MetricBucket.samples, MetricBucket.peers).order_by(MetricBucket.width, MetricBucket.bucket_start)
        ).all()  # fmt: skip
        return [(*row[:2], round(row[2], 9), *row[3:]) for row in rows]

    with db.begin() as session:
        kept = buckets(session)
        session.execute(delete(MetricBucket))
        session.execute(text(migration.backfill_sql(session.get_bind().dialect.name)))
        assert buckets(session) == kept
        assert len(kept) == 7 + 2  # 10-second buckets at 0-30, 50, 400 and 410 s; two 5-minute ones


def test_a_run_counts_once_per_bucket_across_batches_and_a_resent_report_counts_for_nothing(swarm, db):
    """Each step is its own transaction: whether a run already counts in a bucket comes from what earlier
    batches stored (``WorkerRun.last_stored_at``); the last step stores two reports of one run in one batch."""
    _, compare, (a, b, c) = swarm
    start = T0 - timedelta(seconds=3.25)  # a 10-second bucket starts here

    def at(seconds: float) -> datetime:
        return start + timedelta(seconds=seconds)

    def ingest(*items: tuple[str, int, float]) -> list[bool]:
        def message(seq: int) -> MetricReport:
            return MetricReport(seq=seq, step=seq, epoch=1, samples=seq, loss=2.0, samples_per_second=1.0, peers=3)

        with db.begin() as session:
            return metrics.ingest_many(session, [(run, message(seq), at(seconds)) for run, seq, seconds in items])

    def state() -> tuple[list[tuple[int, int, int, int]], dict[str, datetime | None]]:
        with db() as session:
            buckets = session.execute(
                select(
                    MetricBucket.width, MetricBucket.bucket_start, MetricBucket.reports, MetricBucket.peers
                ).order_by(MetricBucket.width, MetricBucket.bucket_start)
            ).all()
            stored_at = {run: session.get(WorkerRun, run).last_stored_at for run in (a, b, c)}
        base = int(start.timestamp())
        return [(w, s - base, r, p) for w, s, r, p in buckets], stored_at

    assert ingest((a, 0, 1.0), (b, 0, 2.0)) == [True, True]
    assert state() == ([(10, 0, 2, 2), (300, 0, 2, 2)], {a: at(1.0), b: at(2.0), c: None})
    assert ingest((a, 1, 5.0)) == [True]  # the same bucket as its report of the previous batch: not a new peer
    assert state() == ([(10, 0, 3, 2), (300, 0, 3, 2)], {a: at(5.0), b: at(2.0), c: None})
    assert ingest((a, 2, 12.0)) == [True]  # its previous report was in the previous bucket: a peer here
    assert state() == ([(10, 0, 3, 2), (10, 10, 1, 1), (300, 0, 4, 2)], {a: at(12.0), b: at(2.0), c: None})
    assert ingest((b, 0, 15.0)) == [False]  # re-sent: no report, no peer, and b's last stored report stays
    assert state() == ([(10, 0, 3, 2), (10, 10, 1, 1), (300, 0, 4, 2)], {a: at(12.0), b: at(2.0), c: None})
    assert ingest((b, 1, 18.0), (b, 2, 19.0)) == [True, True]  # two in one batch: one peer
    assert state() == ([(10, 0, 3, 2), (10, 10, 3, 2), (300, 0, 6, 2)], {a: at(12.0), b: at(19.0), c: None})
    assert [p.peers for p in compare(20.0 - 3.25)] == [2, 2]
