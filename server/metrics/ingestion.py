"""Batched storage of the workers' metric reports: one writer per server process.

Every report socket (``routes/ws.py``) validates and rate-limits its messages, then hands each report to the
process's :class:`ReportWriter` (``enqueue``: a future per report) and reads on, up to its in-flight limit. The
writer stores whatever has queued from all sockets in one transaction (``metrics.ingest_many``: Core statements
only: one insert of the metric points, a COPY on PostgreSQL; one bucket upsert; one update each of the touched
worker runs, volunteers and totals) and only after the commit settles each report's future, which the socket then
acknowledges. So an ack still means "stored": a report queued or in a batch that fails is never acknowledged, and
the worker re-sends it.

Commits are at least ``interval`` apart, on the leading edge: a report after a quiet spell is stored at once, and
the reports that arrive during a commit or its interval ride on the next one. The queue is bounded: when it is full
a socket waits to enqueue, stops reading, and its worker's sends back up (the reporter spools them). A batch that
fails is retried one report at a time, so that one report the database refuses fails alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from swarmhub.common.protocol import Control, ExperimentStatus, MetricReport
from swarmhub.server import metrics
from swarmhub.server.models import Experiment, ExperimentBan, WorkerRun, utcnow
from swarmhub.server.services import services

logger = logging.getLogger("swarmhub.ingestion")
INTERVAL = 0.05  # seconds: at most one commit per interval (20 a second), on the leading edge
MAX_BATCH = 1000  # reports per transaction
MAX_QUEUE = 5000  # reports waiting; beyond this a socket waits before it reads its next message
MAX_OWNERS = 100_000  # worker runs whose experiment and volunteer the writer remembers

Outcome = tuple[Control | None, bool]  # what stops the worker, if anything; whether the report was new


class NotStored(RuntimeError):
    """A report was not stored (its transaction failed, or the server is shutting down): not acknowledged, so
    the worker re-sends it."""


class _Pending:
    """A report between its socket and its transaction."""

    __slots__ = ("worker_id", "report", "received_at", "done")

    def __init__(self, worker_id: str, report: MetricReport, done: asyncio.Future[Outcome]):
        self.worker_id = worker_id
        self.report = report
        self.received_at: datetime = utcnow()
        self.done = done


def store(
    db: sessionmaker[Session],
    items: list[tuple[str, MetricReport, datetime]],
    owners: dict[str, tuple[int, int]] | None = None,
) -> list[Outcome]:
    """Store reports of any workers in one transaction; for each, what stops its worker (a paused experiment, a
    removal: nothing more is stored from a removed volunteer) and whether the report was new. ``owners``: each
    worker run's (experiment, volunteer) as far as already known (they never change), filled in here."""
    owners = {} if owners is None else owners
    with db.begin() as session:
        dialect = session.get_bind().dialect.name
        # Who and where: a run's experiment and volunteer never change (its numbers are read under lock later).
        unknown = {worker_id for worker_id, *_ in items if worker_id not in owners}
        if unknown:
            found = session.execute(
                select(WorkerRun.id, WorkerRun.experiment_id, WorkerRun.user_id).where(
                    metrics.among(WorkerRun.id, unknown, dialect)
                )
            )
            if len(owners) + len(unknown) > MAX_OWNERS:
                owners.clear()
            owners.update({run_id: (experiment_id, user_id) for run_id, experiment_id, user_id in found})
            missing = unknown - owners.keys()
            if missing:
                raise LookupError(f"unknown worker runs {sorted(missing)}")
        runs = {worker_id: owners[worker_id] for worker_id, *_ in items}
        experiment_ids = {experiment_id for experiment_id, _ in runs.values()}
        status_rows = session.execute(select(Experiment.id, Experiment.status).where(Experiment.id.in_(experiment_ids)))
        statuses = {experiment_id: status for experiment_id, status in status_rows}
        bans = select(ExperimentBan.experiment_id, ExperimentBan.user_id).where(
            ExperimentBan.experiment_id.in_(experiment_ids),
            metrics.among(ExperimentBan.user_id, {user_id for _, user_id in runs.values()}, dialect),
        )
        banned = {(experiment_id, user_id) for experiment_id, user_id in session.execute(bans)}

        def removed(worker_id: str) -> bool:
            return runs[worker_id] in banned

        kept = [(worker_id, report, at) for worker_id, report, at in items if not removed(worker_id)]
        new = iter(metrics.ingest_many(session, kept, {runs[worker_id][0] for worker_id, *_ in kept}))
        outcomes: list[Outcome] = []
        for worker_id, _, _ in items:
            status = ExperimentStatus(statuses[runs[worker_id][0]])
            if removed(worker_id):
                control = Control(status=status, removed=True, message="the organizer removed you from this experiment")
                outcomes.append((control, False))
            elif status != ExperimentStatus.running:
                outcomes.append(
                    (Control(status=status, message=f"the organizer set this experiment to {status.value}"), next(new))
                )
            else:
                outcomes.append((None, next(new)))
        return outcomes


class ReportWriter:
    """The process's one writer of metric reports (see the module's docstring). ``submit`` from any socket;
    ``run`` as one task on the server's event loop; ``close`` stores what is queued, then stops."""

    def __init__(
        self,
        db: sessionmaker[Session],
        *,
        interval: float = INTERVAL,
        max_batch: int = MAX_BATCH,
        max_queue: int = MAX_QUEUE,
    ):
        self.db = db
        self.interval = interval
        self.max_batch = max_batch
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue(maxsize=max_queue)
        self._closed = False
        self._owners: dict[str, tuple[int, int]] = {}  # worker run -> (experiment, volunteer), never changes
        self.batches = 0  # transactions committed, for tests and benchmarks
        self.stored = 0

    async def enqueue(self, worker_id: str, report: MetricReport) -> asyncio.Future[Outcome]:
        """Queue one report; returns a future that is set once its transaction has committed (or with what
        storing it raised). Reports queued one after another are stored in that order."""
        if self._closed:
            raise NotStored("the server is shutting down")
        pending = _Pending(worker_id, report, asyncio.get_running_loop().create_future())
        # A socket that went away before its report was stored never looks: retrieved here, not logged by asyncio
        pending.done.add_done_callback(_retrieve)
        if self._queue.full():
            await self._queue.put(pending)  # waits for room: backpressure on this socket
        else:
            self._queue.put_nowait(pending)
        return pending.done

    async def submit(self, worker_id: str, report: MetricReport) -> Outcome:
        """Store one report; returns once its transaction has committed. Raises what storing it raised."""
        return await (await self.enqueue(worker_id, report))

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        last = -math.inf
        while True:
            first = await self._queue.get()
            if first is None:
                return
            wait = last + self.interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)  # the reports that arrive meanwhile join this batch
            batch, stop = [first], False
            while len(batch) < self.max_batch and not self._queue.empty():
                item = self._queue.get_nowait()
                if item is None:
                    stop = True
                    break
                batch.append(item)
            last = loop.time()
            await self._store(batch)
            if stop:
                return

    async def _store(self, batch: list[_Pending]) -> None:
        items = [(p.worker_id, p.report, p.received_at) for p in batch]
        try:
            outcomes = await run_in_threadpool(store, self.db, items, self._owners)
        except Exception:
            if len(batch) == 1:
                logger.exception("storing a report of worker run %s failed", batch[0].worker_id)
                _settle(batch[0], error=True)
                return
            logger.warning("a batch of %d reports failed: storing them one at a time", len(batch), exc_info=True)
            for pending in batch:
                await self._store([pending])
            return
        self.batches += 1
        self.stored += sum(stored for _, stored in outcomes)
        for pending, outcome in zip(batch, outcomes, strict=True):
            _settle(pending, outcome)

    async def close(self) -> None:
        """Refuse new reports, store the queued ones (their sockets get their acks), then stop."""
        self._closed = True
        await self._queue.put(None)


def _retrieve(done: asyncio.Future[Outcome]) -> None:
    if not done.cancelled():
        done.exception()


def _settle(pending: _Pending, outcome: Outcome | None = None, *, error: bool = False) -> None:
    if pending.done.done():  # the socket went away meanwhile
        return
    if error:
        pending.done.set_exception(NotStored("the report could not be stored"))
    else:
        assert outcome is not None
        pending.done.set_result(outcome)


@contextlib.asynccontextmanager
async def writer_lifespan(app: Any) -> AsyncIterator[None]:
    """The report writer's life: started with the server, and drained before its database engine closes."""
    writer = ReportWriter(services(app).sessionmaker)
    services(app).reports = writer
    task = asyncio.create_task(writer.run())
    try:
        yield
    finally:
        try:
            await asyncio.wait_for(writer.close(), timeout=10)
            await asyncio.wait_for(task, timeout=10)
        except asyncio.TimeoutError:  # reports not stored by now are not acknowledged: their workers re-send them
            logger.warning("the report writer did not finish storing in time: stopping it")
            task.cancel()
        services(app).reports = None
