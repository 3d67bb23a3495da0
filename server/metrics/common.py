"""What the metrics modules share: the Core tables they read and write, the buckets' widths, the server clock, and
a contribution's share of an experiment (leaderboards, profiles, teams)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, any_, bindparam
from sqlalchemy.dialects.postgresql import ARRAY

from swarmhub.server.metrics import clock
from swarmhub.server.models import ExperimentTotal, MetricBucket, MetricPoint, User, VolunteerTotal, WorkerRun

# The series' resolutions in seconds, finest first: 300 buckets show 50 minutes, or 25 hours.
BUCKET_WIDTHS = (10, 300)

# Core tables for the batch's statements: plain rows and bound parameters, no ORM bookkeeping per row
POINTS_TABLE = cast(Table, MetricPoint.__table__)
BUCKETS_TABLE = cast(Table, MetricBucket.__table__)
RUNS_TABLE = cast(Table, WorkerRun.__table__)
VOLUNTEERS_TABLE = cast(Table, VolunteerTotal.__table__)
TOTALS_TABLE = cast(Table, ExperimentTotal.__table__)
USERS_TABLE = cast(Table, User.__table__)


def current_time() -> datetime:
    """The server clock: ``clock.utcnow`` at the call (tests and benchmarks set it)."""
    return clock.utcnow()


def share_of(part: int, total: int | None) -> float:
    """``part`` as a fraction of an experiment's ``total`` verified samples, to 4 places; 0.0 while it has none."""
    return round(part / total, 4) if total else 0.0


def among(column: Any, values: Any, dialect: str) -> Any:
    """``column IN values``; on PostgreSQL as ``column = ANY(array)``: one parameter instead of one per value,
    so the statement's text (and its parse in the driver and the database) is the same for any number."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(column.type)))
    return column.in_(values)


def active_since(window_seconds: int) -> datetime:
    return current_time() - timedelta(seconds=window_seconds)


def device_class(device: str) -> str:
    return device.split(":", 1)[0].lower() or "cpu"
