"""The metric buckets one batch of reports adds to (:class:`Buckets`): the dashboard's series read these sums, per
experiment and bucket width, instead of the raw points."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.orm import Session

from swarmhub.common.protocol import MetricReport
from swarmhub.server.metrics.common import BUCKET_WIDTHS, BUCKETS_TABLE
from swarmhub.server.models import MetricBucket


class RunCounts(Protocol):
    """A worker run's numbers before a report moves them (the store's run rows)."""

    experiment_id: int
    samples: int
    last_seq: int
    last_stored_at: datetime | None


class Buckets:
    """The metric buckets a batch adds to, summed per bucket in memory and written with one upsert. Each newly
    stored report is added before its run's latest numbers move (:meth:`add`): an accepted report (seq above
    the run's latest) adds its samples over the run's previous count (the first report: all of them), a late
    one adds none; the run counts once per bucket, on its first stored report there (its previous stored
    report, ``last_stored_at``, arrived before the bucket began)."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, int, int], list[float]] = {}

    def add(self, worker: RunCounts, report: MetricReport, at: datetime) -> None:
        added = report.samples - worker.samples if report.seq > worker.last_seq else 0
        second = math.floor(at.timestamp())
        previous = worker.last_stored_at.timestamp() if worker.last_stored_at is not None else None
        for width in BUCKET_WIDTHS:
            start = second // width * width
            sums = self.sums.setdefault((worker.experiment_id, width, start), [0.0, 0, 0, 0])
            sums[0] += report.loss
            sums[1] += 1
            sums[2] += added
            sums[3] += int(previous is None or previous < start)

    def write(self, session: Session, insert: Any) -> None:
        if not self.sums:
            return
        rows = [
            {
                "experiment_id": experiment_id,
                "width": width,
                "bucket_start": start,
                "loss_sum": loss_sum,
                "reports": reports,
                "samples": samples,
                "peers": peers,
            }
            for (experiment_id, width, start), (loss_sum, reports, samples, peers) in sorted(self.sums.items())
        ]
        stmt = insert(BUCKETS_TABLE)
        stmt = stmt.on_conflict_do_update(
            index_elements=["experiment_id", "width", "bucket_start"],
            set_={
                "loss_sum": MetricBucket.loss_sum + stmt.excluded.loss_sum,
                "reports": MetricBucket.reports + stmt.excluded.reports,
                "samples": MetricBucket.samples + stmt.excluded.samples,
                "peers": MetricBucket.peers + stmt.excluded.peers,
            },
        )
        session.execute(stmt, rows)
