"""The report writer (server/metrics/ingestion.py): reports from many sockets are stored in few transactions, each
answered only once committed, exactly once, with the same totals and buckets as storing them one by one; a
removed volunteer's report and a report the database refuses fail alone; a full queue makes senders wait."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import func, select

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments, metrics
from swarmhub.server.metrics.ingestion import ReportWriter
from swarmhub.server.models import ExperimentBan, ExperimentTotal, MetricBucket, MetricPoint, VolunteerTotal, WorkerRun

from .conftest import make_experiment, make_user

pytestmark = pytest.mark.both_databases  # ingestion uses COPY and array updates on PostgreSQL


def report(seq: int, samples: int, loss: float = 2.0) -> MetricReport:
    return MetricReport(seq=seq, step=seq, epoch=1, samples=samples, loss=loss, samples_per_second=10.0, peers=3)


def start_runs(db, slug: str, count: int) -> list[str]:
    owner = make_user(db, f"{slug}-owner")
    experiment = make_experiment(db, owner, slug=slug, status="running")
    users = [make_user(db, f"{slug}-v{i}") for i in range(count)]
    with db.begin() as session:
        exp = experiments.get_visible(session, experiment.slug, None)
        return [experiments.start_worker_run(session, exp, session.merge(u), "cpu").id for u in users]


def count(db, model) -> int:
    with db() as session:
        return session.scalar(select(func.count()).select_from(model))


async def with_writer(db, job, **options):
    writer = ReportWriter(db, **options)
    task = asyncio.create_task(writer.run())
    try:
        return writer, await job(writer)
    finally:
        await writer.close()
        await task


def test_concurrent_reports_share_transactions_and_each_is_stored_once(db):
    runs = start_runs(db, "batch", 20)

    async def job(writer):
        async def worker(run_id):  # as a socket does: the next report once the previous one is answered
            return [await writer.submit(run_id, report(seq, 10 * (seq + 1))) for seq in range(5)]

        return await asyncio.gather(*(worker(run_id) for run_id in runs))

    writer, outcomes = asyncio.run(with_writer(db, job))
    assert all(outcome == (None, True) for per_run in outcomes for outcome in per_run)
    assert count(db, MetricPoint) == 100 and writer.stored == 100
    assert writer.batches <= 25  # 100 reports from 20 sockets at once: batches of about 20, not 100 commits
    with db() as session:
        assert {run.samples for run in session.scalars(select(WorkerRun))} == {50}
        assert session.scalar(select(func.sum(VolunteerTotal.claimed_samples))) == 20 * 50
        assert session.scalar(select(func.sum(MetricBucket.reports)).where(MetricBucket.width == 10)) == 100


def test_a_report_given_twice_in_one_batch_is_stored_once(db):
    (run_id,) = start_runs(db, "twice", 1)

    async def job(writer):
        return await asyncio.gather(*(writer.submit(run_id, report(0, 32)) for _ in range(3)))

    _, outcomes = asyncio.run(with_writer(db, job))
    assert sorted(stored for _, stored in outcomes) == [False, False, True]
    assert count(db, MetricPoint) == 1
    with db() as session:
        assert session.scalar(select(VolunteerTotal.claimed_samples)) == 32


def test_a_removed_volunteer_and_a_refused_report_fail_alone(db):
    runs = start_runs(db, "mixed", 3)
    with db.begin() as session:
        removed = session.get(WorkerRun, runs[0])
        session.add(ExperimentBan(experiment_id=removed.experiment_id, user_id=removed.user_id))

    async def job(writer):
        return await asyncio.gather(
            writer.submit(runs[0], report(0, 10)),
            writer.submit("no-such-run", report(0, 10)),
            writer.submit(runs[1], report(0, 10)),
            writer.submit(runs[2], report(0, 10)),
            return_exceptions=True,
        )

    _, (banned, refused, *others) = asyncio.run(with_writer(db, job, interval=0.2))
    assert banned[0].removed and banned[1] is False
    assert isinstance(refused, RuntimeError)
    assert others == [(None, True), (None, True)]
    with db() as session:
        assert set(session.scalars(select(MetricPoint.worker_run_id))) == {runs[1], runs[2]}


def test_a_full_queue_makes_the_next_sender_wait(db):
    (run_id,) = start_runs(db, "full", 1)

    async def scenario():
        writer = ReportWriter(db, max_queue=1)
        first = asyncio.create_task(writer.submit(run_id, report(0, 1)))
        second = asyncio.create_task(writer.submit(run_id, report(1, 2)))
        await asyncio.sleep(0.1)
        waiting = writer._queue.full() and not first.done() and not second.done()
        task = asyncio.create_task(writer.run())  # the writer starts: both are stored and answered
        results = await asyncio.gather(first, second)
        await writer.close()
        await task
        return waiting, results

    waiting, results = asyncio.run(scenario())
    assert waiting and results == [(None, True), (None, True)]


@pytest.mark.parametrize("batch", [1, 7, 100])
def test_batches_keep_the_same_totals_and_buckets_as_one_by_one(db, batch):
    """The same reports (duplicates, a late one, several per bucket, a bucket boundary) stored one at a time
    into one experiment and in batches into another give the same totals, worker runs and buckets."""
    singles, batched = start_runs(db, "singles", 3), start_runs(db, "batched", 3)
    t0 = datetime(2026, 11, 30, 12, 0, 5, tzinfo=timezone.utc)
    plan = []  # (run index, report, seconds after t0)
    for step in range(12):
        for i in range(3):
            plan.append((i, report(step, 100 * (step + 1) + i, loss=1.0 + step + i), 3 * step + i * 0.4))
    plan.insert(10, plan[4])  # a duplicate
    plan.insert(20, (1, report(2, 150), 14.0))  # a late report (seq below the run's latest)

    def store(runs, size):
        for start in range(0, len(plan), size):
            with db.begin() as session:
                chunk = plan[start : start + size]
                items = [(runs[i], r, t0 + timedelta(seconds=s)) for i, r, s in chunk]
                metrics.ingest_many(session, items)

    store(singles, 1)
    store(batched, batch)

    def state(runs):
        with db() as session:
            workers = [session.get(WorkerRun, run_id) for run_id in runs]
            experiment_id = workers[0].experiment_id
            volunteers = session.scalars(
                select(VolunteerTotal).where(VolunteerTotal.experiment_id == experiment_id)
            ).all()
            buckets = session.scalars(
                select(MetricBucket)
                .where(MetricBucket.experiment_id == experiment_id)
                .order_by(MetricBucket.width, MetricBucket.bucket_start)
            ).all()
            total = session.get(ExperimentTotal, experiment_id)
            return (
                [(w.last_seq, w.samples, w.epoch, w.loss, w.samples_per_second, w.last_seen_at) for w in workers],
                sorted(
                    (v.claimed_samples, v.peak_claimed_samples_per_second, v.device_classes, v.last_report_at)
                    for v in volunteers
                ),
                (total.claimed_samples, total.worker_epoch, total.signed_peaks),
                [(b.width, b.bucket_start, b.loss_sum, b.reports, b.samples, b.peers) for b in buckets],
            )

    assert state(batched) == state(singles)


def test_rows_the_session_holds_read_the_stored_numbers(db):
    """``ingest`` writes with Core statements: a worker run and totals already loaded in the caller's session
    show the new numbers afterwards, and a volunteer's first report creates their totals row."""
    (run_id,) = start_runs(db, "held", 1)
    with db.begin() as session:
        worker = session.get(WorkerRun, run_id)
        key = (worker.experiment_id, worker.user_id)
        assert session.get(VolunteerTotal, key) is None
        assert metrics.ingest(session, worker, report(0, 40))
        assert (worker.last_seq, worker.samples, worker.samples_per_second) == (0, 40, 10.0)
        volunteer, total = session.get(VolunteerTotal, key), session.get(ExperimentTotal, worker.experiment_id)
        assert (volunteer.sort_name, volunteer.claimed_samples, volunteer.device_classes) == ("held-v0", 40, ["cpu"])
        assert total.claimed_samples == 40
        assert metrics.ingest(session, worker, report(1, 70))
        assert (worker.last_seq, worker.samples, volunteer.claimed_samples, total.claimed_samples) == (1, 70, 70, 70)
