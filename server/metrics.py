"""Metric ingestion and what dashboards show: summary, loss/throughput series and the leaderboard."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Annotated, Any, NamedTuple, cast

from pydantic import BaseModel, Field, TypeAdapter, ValidationError
from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    Integer,
    Row,
    Select,
    String,
    Table,
    Text,
    TypeDecorator,
    and_,
    any_,
    bindparam,
    func,
    select,
    text,
    tuple_,
    union_all,
    update,
)
from sqlalchemy import cast as cast_
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.worker.protocol import MetricReport

from . import contributions
from .errors import BadRequest
from .models import Experiment, ExperimentTotal, MetricBucket, MetricPoint, User, VolunteerTotal, WorkerRun, utcnow
from .security import StoredText

SERIES_POINTS = 300  # at most this many buckets per series
# The series' resolutions in seconds, finest first: 300 buckets show 50 minutes, or 25 hours.
BUCKET_WIDTHS = (10, 300)


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


class MetricsPublic(BaseModel):
    summary: Summary
    series: list[SeriesPoint]


# Core tables for the batch's statements: plain rows and bound parameters, no ORM bookkeeping per row
_POINTS = cast(Table, MetricPoint.__table__)
_BUCKETS = cast(Table, MetricBucket.__table__)
_RUNS = cast(Table, WorkerRun.__table__)
_VOLUNTEERS = cast(Table, VolunteerTotal.__table__)
_TOTALS = cast(Table, ExperimentTotal.__table__)
_USERS = cast(Table, User.__table__)

_RUN_COLUMNS = ("last_seen_at", "last_stored_at", "samples", "epoch", "loss", "samples_per_second", "last_seq")
_VOLUNTEER_COLUMNS = ("claimed_samples", "peak_claimed_samples_per_second", "device_classes", "last_report_at")
_TOTAL_COLUMNS = ("claimed_samples", "worker_epoch", "signed_peaks")  # signed_peaks: written when it moves


def _update_by_key(table: Table, keys: tuple[str, ...], columns: tuple[str, ...]) -> Any:
    """An UPDATE of ``columns`` where the row's ``keys`` match, for executemany: each parameter set names the
    keys as ``k_<key>`` and the new values as ``v_<column>``."""
    return (
        update(table)
        .where(*(table.c[key] == bindparam(f"k_{key}") for key in keys))
        .values({column: bindparam(f"v_{column}") for column in columns})
    )


_UPDATE_RUNS = _update_by_key(_RUNS, ("id",), _RUN_COLUMNS)
_UPDATE_VOLUNTEERS = _update_by_key(_VOLUNTEERS, ("experiment_id", "user_id"), _VOLUNTEER_COLUMNS)
_UPDATE_TOTALS = _update_by_key(_TOTALS, ("experiment_id",), _TOTAL_COLUMNS[:2])
_UPDATE_PEAKS = _update_by_key(_TOTALS, ("experiment_id",), _TOTAL_COLUMNS[2:])


class _Run:
    """A worker run's row as a batch reads and moves it."""

    __slots__ = ("id", "experiment_id", "user_id", "device", *_RUN_COLUMNS)

    def __init__(self, row: Any):
        for name in self.__slots__:
            setattr(self, name, getattr(row, name))

    id: str
    experiment_id: int
    user_id: int
    device: str
    last_seen_at: datetime | None
    last_stored_at: datetime | None
    samples: int
    epoch: int
    loss: float | None
    samples_per_second: float
    last_seq: int


class _Volunteer:
    """A volunteer's totals row in one experiment as a batch moves it (``new``: not in the database yet)."""

    __slots__ = ("user_id", "new", "peak_signed_samples_per_second", *_VOLUNTEER_COLUMNS)

    def __init__(self, user_id: int, row: Any = None):
        self.user_id = user_id
        self.new = row is None
        self.claimed_samples: int = row.claimed_samples if row is not None else 0
        self.peak_claimed_samples_per_second: float = row.peak_claimed_samples_per_second if row is not None else 0.0
        self.device_classes: list[str] = row.device_classes if row is not None else []
        self.last_report_at: datetime | None = row.last_report_at if row is not None else None
        self.peak_signed_samples_per_second: float = row.peak_signed_samples_per_second if row is not None else 0.0


class _Totals:
    """An experiment's totals row, locked, as a batch moves it."""

    __slots__ = ("experiment_id", *_TOTAL_COLUMNS)

    def __init__(self, row: Any):
        self.experiment_id: int = row.experiment_id
        self.claimed_samples: int = row.claimed_samples
        self.worker_epoch: int = row.worker_epoch
        self.signed_peaks: dict[str, float] = row.signed_peaks


def _params(row: Any, keys: tuple[str, ...], columns: tuple[str, ...]) -> dict[str, Any]:
    return {**{f"k_{key}": getattr(row, key) for key in keys}, **{f"v_{c}": getattr(row, c) for c in columns}}


def among(column: Any, values: Any, dialect: str) -> Any:
    """``column IN values``; on PostgreSQL as ``column = ANY(array)``: one parameter instead of one per value,
    so the statement's text (and its parse in the driver and the database) is the same for any number."""
    if dialect == "postgresql":
        return column == any_(bindparam(None, list(values), type_=ARRAY(column.type)))
    return column.in_(values)


def _update_runs(session: Session, runs: Sequence[_Run], dialect: str) -> None:
    """Write the runs' moving columns: on PostgreSQL one UPDATE joined to arrays of the new values (one
    statement, not one per run); elsewhere an executemany."""
    if dialect == "postgresql":
        session.execute(_UPDATE_RUNS_FROM_ARRAYS, {c: [getattr(run, c) for run in runs] for c in ("id", *_RUN_COLUMNS)})
    else:
        session.execute(_UPDATE_RUNS, [_params(run, ("id",), _RUN_COLUMNS) for run in runs])


def _update_from_arrays(table: Table, key: str, columns: tuple[str, ...]) -> Any:
    """PostgreSQL: an UPDATE of ``columns`` from parameters that are arrays (``key`` and each column, by name),
    one element per row."""
    names = (key, *columns)
    arrays = ", ".join(f"CAST(:{c} AS {table.c[c].type.compile(dialect=postgresql.dialect())}[])" for c in names)
    assignments = ", ".join(f"{c} = v.{c}" for c in columns)
    # Only the table's own names go into the text; the values are parameters.
    rows = f"unnest({arrays}) AS v({', '.join(names)})"
    return text(f"UPDATE {table.name} SET {assignments} FROM {rows} WHERE {table.name}.{key} = v.{key}")  # noqa: S608


_UPDATE_RUNS_FROM_ARRAYS = _update_from_arrays(_RUNS, "id", _RUN_COLUMNS)


def _insert_points(insert: Any, returning: bool) -> Any:
    stmt = insert(_POINTS).on_conflict_do_nothing(index_elements=["worker_run_id", "seq"])
    return stmt.returning(_POINTS.c.worker_run_id, _POINTS.c.seq) if returning else stmt


_POINT_COLUMNS = (
    "experiment_id",
    "worker_run_id",
    "received_at",
    "seq",
    "step",
    "epoch",
    "samples",
    "loss",
    "samples_per_second",
    "peers",
    "averaged_peers",
)
_COPY_POINTS = f"COPY {_POINTS.name} ({', '.join(_POINT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


def _binary_copy_type(column: Any) -> str:
    """The PostgreSQL type a binary COPY sends for a column (it must be the column's own)."""
    kind = column.type.impl if isinstance(column.type, TypeDecorator) else column.type
    for sql_type, name in ((BigInteger, "int8"), (Integer, "int4"), (String, "varchar"), (Float, "float8")):
        if isinstance(kind, sql_type):
            return name
    if isinstance(kind, DateTime) and kind.timezone:
        return "timestamptz"
    raise TypeError(f"no binary COPY type for {column}")


_COPY_TYPES = [_binary_copy_type(_POINTS.c[column]) for column in _POINT_COLUMNS]


def _copy_points(session: Session, points: list[dict[str, Any]]) -> None:
    """PostgreSQL: new metric points with one binary COPY, in the session's transaction: it costs the database
    and the server about half of an executemany INSERT (docs/server-benchmarks.md). Like that INSERT, it fails
    on a point that is stored already, so it is only given points above their run's last seq."""
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        with cursor.copy(_COPY_POINTS) as copy:
            copy.set_types(_COPY_TYPES)
            for point in points:
                copy.write_row([point[column] for column in _POINT_COLUMNS])
    finally:
        cursor.close()


def _lock_totals(session: Session, experiment_id: int, insert: Any) -> _Totals:
    # As contributions.experiment_totals, without an ORM object: everything that changes totals takes this
    # lock first, so updates of one experiment's totals never interleave.
    stmt = (
        select(_TOTALS.c.experiment_id, *(_TOTALS.c[column] for column in _TOTAL_COLUMNS))
        .where(_TOTALS.c.experiment_id == experiment_id)
        .with_for_update()
    )
    row = session.execute(stmt).one_or_none()
    if row is None:
        session.execute(insert(_TOTALS).values(experiment_id=experiment_id).on_conflict_do_nothing())
        row = session.execute(stmt).one()
    return _Totals(row)


def ingest(session: Session, worker: WorkerRun, report: MetricReport) -> bool:
    """Store one report exactly once, and keep the run's latest numbers and the volunteer's and experiment's
    running totals in step. Returns False for a duplicate (already stored) message."""
    return ingest_many(session, [(worker.id, report, utcnow())])[0]


def ingest_many(
    session: Session, reports: Sequence[tuple[str, MetricReport, datetime]], experiment_ids: set[int] | None = None
) -> list[bool]:
    """Store reports (each with its worker run's id and the time it was received) as :func:`ingest` would one
    after another, in the order given, with a few Core statements for the whole batch: one insert of the metric
    points (a binary COPY on PostgreSQL), one upsert of the buckets they fall in, and one UPDATE each for the
    touched worker runs (on PostgreSQL from arrays), volunteer totals and experiment totals (executemany).
    Returns, for each report, whether it was new (False: already stored, or given twice here). Worker runs and
    totals the session already holds as ORM objects are expired, so that they read the new numbers on next
    access. ``experiment_ids``: the reports' experiments, when the caller knows them already."""
    if not reports:
        return []
    session.flush()  # what the session holds goes first: the statements below bypass its unit of work
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    run_ids = {run_id for run_id, *_ in reports}
    # Locked until commit, in one order, so that batches and ledger reads of an experiment take turns and never
    # wait on each other crosswise; the runs are read under those locks.
    if experiment_ids is None:
        experiment_ids = set(
            session.scalars(select(_RUNS.c.experiment_id).where(among(_RUNS.c.id, run_ids, dialect)).distinct())
        )
    totals = {eid: _lock_totals(session, eid, insert) for eid in sorted(experiment_ids)}
    run_rows = session.execute(
        select(
            _RUNS.c.id, _RUNS.c.experiment_id, _RUNS.c.user_id, _RUNS.c.device, *(_RUNS.c[c] for c in _RUN_COLUMNS)
        ).where(among(_RUNS.c.id, run_ids, dialect))
    )
    runs = {row.id: _Run(row) for row in run_rows}
    if len(runs) < len(run_ids):  # removed meanwhile (its experiment was deleted)
        raise LookupError(f"unknown worker runs {sorted(run_ids - runs.keys())}")
    volunteers: dict[tuple[int, int], _Volunteer] = {}
    for eid in totals:
        users = {run.user_id for run in runs.values() if run.experiment_id == eid}
        found = session.execute(
            select(
                _VOLUNTEERS.c.user_id,
                _VOLUNTEERS.c.peak_signed_samples_per_second,
                *(_VOLUNTEERS.c[c] for c in _VOLUNTEER_COLUMNS),
            ).where(_VOLUNTEERS.c.experiment_id == eid, among(_VOLUNTEERS.c.user_id, users, dialect))
        )
        for row in found:
            volunteers[eid, row.user_id] = _Volunteer(row.user_id, row)
        for user_id in users:
            if (eid, user_id) not in volunteers:
                volunteers[eid, user_id] = _Volunteer(user_id)

    first: list[bool] = []  # the first time this batch holds the (run, seq): later copies are duplicates
    seen: set[tuple[str, int]] = set()
    # A run's last_seq is the highest seq stored for it, so a report above it is new (the runs were read under
    # the experiment's lock); only the others, re-sent or late, may be stored already.
    fresh: list[dict[str, Any]] = []
    resent: list[dict[str, Any]] = []
    for run_id, report, at in reports:
        key = (run_id, report.seq)
        first.append(key not in seen)
        if first[-1]:
            seen.add(key)
            values = (runs[run_id].experiment_id, run_id, at, report.seq, report.step, report.epoch)
            numbers = (report.samples, report.loss, report.samples_per_second, report.peers, report.averaged_peers)
            point = dict(zip(_POINT_COLUMNS, (*values, *numbers), strict=True))  # the COPY's column order too
            (fresh if report.seq > runs[run_id].last_seq else resent).append(point)
    # One executemany for the new rows (compiled once); the re-sent ones with RETURNING, which names those
    # that were not stored yet.
    inserted = {(point["worker_run_id"], point["seq"]) for point in fresh}
    if fresh and dialect == "postgresql":
        _copy_points(session, fresh)
    elif fresh:
        session.execute(_insert_points(insert, returning=False), fresh)
    if resent:
        inserted |= {(run_id, seq) for run_id, seq in session.execute(_insert_points(insert, returning=True), resent)}

    buckets = _Buckets()
    classes: dict[str, str] = {}  # device -> device class
    peaks_changed: set[int] = set()
    stored = []
    for (run_id, report, at), is_first in zip(reports, first, strict=True):
        worker = runs[run_id]
        new = is_first and (run_id, report.seq) in inserted
        total = totals[worker.experiment_id]
        volunteer = volunteers[worker.experiment_id, worker.user_id]
        if new:
            buckets.add(worker, report, at)
            if worker.last_stored_at is None or at > worker.last_stored_at:
                worker.last_stored_at = at
            if report.seq > worker.last_seq:
                claimed = report.samples - worker.samples  # the run's count replaces its previous one in the sums
                volunteer.claimed_samples += claimed
                total.claimed_samples += claimed
                total.worker_epoch = max(total.worker_epoch, report.epoch)
                worker.last_seq = report.seq
                worker.samples = report.samples
                worker.epoch = report.epoch
                worker.loss = report.loss
                worker.samples_per_second = report.samples_per_second
            if report.samples_per_second > volunteer.peak_claimed_samples_per_second:
                volunteer.peak_claimed_samples_per_second = report.samples_per_second
        cls = classes.get(worker.device)
        if cls is None:
            cls = classes[worker.device] = device_class(worker.device)
        if cls not in volunteer.device_classes:
            volunteer.device_classes = sorted([*volunteer.device_classes, cls])
            peak = max(total.signed_peaks.get(cls, 0.0), volunteer.peak_signed_samples_per_second)
            if total.signed_peaks.get(cls) != peak:  # as contributions.raise_class_peaks
                total.signed_peaks = {**total.signed_peaks, cls: peak}
                peaks_changed.add(total.experiment_id)
        worker.last_seen_at = at
        if volunteer.last_report_at is None or at > volunteer.last_report_at:
            volunteer.last_report_at = at
        stored.append(new)
    buckets.write(session, insert)
    _update_runs(session, list(runs.values()), dialect)
    added = [
        {"experiment_id": eid, "user_id": v.user_id, **{c: getattr(v, c) for c in _VOLUNTEER_COLUMNS}}
        for (eid, _), v in volunteers.items()
        if v.new
    ]
    if added:
        names = dict(
            session.execute(select(User.id, User.username).where(User.id.in_({r["user_id"] for r in added}))).all()
        )
        session.execute(insert(_VOLUNTEERS), [{**r, "sort_name": names[r["user_id"]].lower()} for r in added])
    changed = [
        {"k_experiment_id": eid, "k_user_id": v.user_id, **{f"v_{c}": getattr(v, c) for c in _VOLUNTEER_COLUMNS}}
        for (eid, _), v in volunteers.items()
        if not v.new
    ]
    if changed:
        session.execute(_UPDATE_VOLUNTEERS, changed)
    session.execute(_UPDATE_TOTALS, [_params(t, ("experiment_id",), _TOTAL_COLUMNS[:2]) for t in totals.values()])
    if peaks_changed:
        changed_peaks = [_params(totals[eid], ("experiment_id",), _TOTAL_COLUMNS[2:]) for eid in sorted(peaks_changed)]
        session.execute(_UPDATE_PEAKS, changed_peaks)
    for obj in list(session.identity_map.values()):
        if isinstance(obj, (WorkerRun, VolunteerTotal, ExperimentTotal)):
            session.expire(obj)
    return stored


class _Buckets:
    """The metric buckets a batch adds to, summed per bucket in memory and written with one upsert. Each newly
    stored report is added before its run's latest numbers move (:meth:`add`): an accepted report (seq above
    the run's latest) adds its samples over the run's previous count (the first report: all of them), a late
    one adds none; the run counts once per bucket, on its first stored report there (its previous stored
    report, ``last_stored_at``, arrived before the bucket began)."""

    def __init__(self) -> None:
        self.sums: dict[tuple[int, int, int], list[float]] = {}

    def add(self, worker: _Run, report: MetricReport, at: datetime) -> None:
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
        stmt = insert(_BUCKETS)
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


def _active_since(window_seconds: int) -> datetime:
    return utcnow() - timedelta(seconds=window_seconds)


# A claim is implausible when it is this far above what the swarm's signed records show.
CLAIM_SLACK = 0.25  # claimed samples over verified + pending, beyond the reporting lag
THROUGHPUT_FACTOR = 3.0  # claimed peak rate over the fastest signed rate of the same device class
# A volunteer's own signed peak over the fastest other peer of their classes: honest devices of one class can
# differ several times over (a laptop and a workstation are both "cpu"), so only an order of magnitude is flagged
SIGNED_FACTOR = 10.0

LEADERBOARD_LIMIT = 100  # rows of a page unless asked otherwise; what dashboards show
LEADERBOARD_MAX_LIMIT = 1000
# The API serves offsets up to here; deeper pages follow the cursor. An offset page walks the board's index up to
# it, so its cost grows with the offset (a cursor page's does not): the window bounds every page's cost.
LEADERBOARD_MAX_OFFSET = 10_000


def device_class(device: str) -> str:
    return device.split(":", 1)[0].lower() or "cpu"


class Cursor(NamedTuple):
    """Where a leaderboard page ended (its last row's rank and sort key): the next page is the rows after it.
    Clients get it as opaque text (base64 of the JSON array) and only hand it back."""

    rank: Annotated[int, Field(ge=1, le=2**62)]
    verified: Annotated[int, Field(ge=0, le=2**62)]
    claimed: Annotated[int, Field(ge=0, le=2**62)]
    sort_name: Annotated[StoredText, Field(max_length=32)]
    user_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return base64.urlsafe_b64encode(_CURSOR.dump_json(self)).decode().rstrip("=")

    @staticmethod
    def decode(text: str) -> Cursor:
        """The cursor a page returned; a 400 naming ``cursor`` for anything else."""
        try:
            return _CURSOR.validate_json(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, ValidationError):  # a base64 error is a ValueError
            raise BadRequest("not a cursor this leaderboard returned", field="cursor") from None

    @staticmethod
    def of(rank: int, row: TotalRow) -> Cursor:
        return Cursor(rank, row.verified_samples, row.claimed_samples, row.sort_name, row.user_id)


_CURSOR = TypeAdapter(Cursor)


class LeaderboardPage(BaseModel):
    entries: list[LeaderboardEntry]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")


# A page's totals are read as plain rows (attribute access by column name), not as ORM objects: building and
# tracking 100 mapped objects was most of a page's time in Python.
TotalRow = Row[Any]


def _rank_order(columns: Any) -> list[Any]:
    # The order of ix_volunteer_totals_rank, so that a page is an index range that stops at the page.
    return [columns.verified_samples.desc(), columns.claimed_samples.desc(), columns.sort_name, columns.user_id]


# What a page's rows carry: the entry's columns, and for the organizer's flags the peaks, classes and epochs too
# (the device classes are JSON: only read where used, and decoded once per distinct set, device_classes_of).
_ENTRY_COLUMNS = (
    "user_id",
    "sort_name",
    "verified_samples",
    "pending_samples",
    "claimed_samples",
    "online_seconds",
    "last_report_at",
    "last_signed_at",
)
_FLAG_COLUMNS = (
    *_ENTRY_COLUMNS,
    "epochs",
    "device_classes",
    "peak_claimed_samples_per_second",
    "peak_signed_samples_per_second",
    "swarm_flags",
)
# An offset from here on walks the index alone to the page (an index-only scan of the rank keys), then reads
# the page's rows; below it, reading the rows as the index gives them is cheaper than the second lookup. The two
# were even at 500 on bench/queries.py's build (4.1 ms each; 3.7 against 4.5 ms at 0, 4.8 against 4.2 at 1,000).
KEYS_ONLY_FROM = 500


def _page_statement(kind: str, with_flags: bool) -> Select[Any]:
    """A page in one statement, of one kind: ``top`` (``limit`` rows from a small ``offset``), ``deep`` (from a
    large one) or ``after`` (after a cursor: ``verified``, ``claimed``, ``sort_name``, ``user_id``). Then for the
    page's rows only their names and current rates (a rate is a worker's while it reports: the sum over the
    volunteer's runs seen since ``since``), and the experiment's totals beside every row. Built once per kind
    (its values are bound parameters), so a request does not build a statement."""
    volunteer = _VOLUNTEERS.c
    experiment_id = bindparam("experiment_id", type_=Integer)
    limit, offset = bindparam("limit", type_=Integer), bindparam("offset", type_=Integer)
    names = _FLAG_COLUMNS if with_flags else _ENTRY_COLUMNS

    def ranked(*columns: Any) -> Select[Any]:  # the order of ix_volunteer_totals_rank: a range of the index
        return select(*columns).where(volunteer.experiment_id == experiment_id).order_by(*_rank_order(volunteer))

    if kind == "deep":
        # rank keys only (every column one of the index's), then the page's rows by their primary key
        page = (
            ranked(volunteer.user_id, volunteer.verified_samples, volunteer.claimed_samples, volunteer.sort_name)
            .limit(limit)
            .offset(offset)
            .subquery("page")
        )
        columns: list[Any] = [volunteer[name] for name in names]
        source: Any = page.join(
            _VOLUNTEERS, and_(volunteer.experiment_id == experiment_id, volunteer.user_id == page.c.user_id)
        )
    else:
        rows = [volunteer[name] for name in names]
        if kind == "top":
            page = ranked(*rows).limit(limit).offset(offset).subquery("page")
        else:
            # The board's order mixes descending totals with ascending names, so "after" is no single index
            # range; it is three, each read up to ``limit`` rows, merged in order: the same totals and a later
            # name, the same verified samples and fewer claimed, then fewer verified.
            verified, claimed = bindparam("verified", type_=BigInteger), bindparam("claimed", type_=BigInteger)
            later = tuple_(volunteer.sort_name, volunteer.user_id) > tuple_(
                bindparam("sort_name", type_=volunteer.sort_name.type), bindparam("user_id", type_=Integer)
            )
            ranges = [
                (volunteer.verified_samples == verified, volunteer.claimed_samples == claimed, later),
                (volunteer.verified_samples == verified, volunteer.claimed_samples < claimed),
                (volunteer.verified_samples < verified,),
            ]
            parts = [ranked(*rows).where(*condition).limit(limit).subquery() for condition in ranges]
            merged = union_all(*(select(part) for part in parts)).subquery("after")
            page = select(merged).order_by(*_rank_order(merged.c)).limit(limit).subquery("page")
        columns = [page.c[name] for name in names]
        source = page
    # as text, decoded through a cache: a board holds a few distinct sets of classes, not one per row
    columns = [cast_(c, Text).label(c.name) if c.name == "device_classes" else c for c in columns]
    run, totals = _RUNS.c, _TOTALS.c
    rate = select(func.sum(run.samples_per_second)).where(
        run.experiment_id == experiment_id, run.user_id == page.c.user_id, run.last_seen_at >= bindparam("since")
    )
    # scalar subqueries: a value (or null) even before the experiment has totals
    columns += [
        _USERS.c.username,
        rate.scalar_subquery().label("rate"),
        select(totals.verified_samples)
        .where(totals.experiment_id == experiment_id)
        .scalar_subquery()
        .label("total_verified"),
    ]
    if with_flags:  # as text: parsed once, not once per row
        peaks = select(cast_(totals.signed_peaks, Text)).where(totals.experiment_id == experiment_id)
        columns.append(peaks.scalar_subquery().label("signed_peaks"))
    return (
        select(*columns).select_from(source).join(_USERS, _USERS.c.id == page.c.user_id).order_by(*_rank_order(page.c))
    )


_PAGES = {(kind, flags): _page_statement(kind, flags) for kind in ("top", "deep", "after") for flags in (False, True)}


def leaderboard(
    session: Session,
    experiment: Experiment,
    window_seconds: int,
    *,
    with_flags: bool = False,
    limit: int = LEADERBOARD_LIMIT,
    offset: int = 0,
) -> list[LeaderboardEntry]:
    """One page of the volunteers (see :func:`leaderboard_page`), by offset."""
    return leaderboard_page(
        session, experiment, window_seconds, with_flags=with_flags, limit=limit, offset=offset
    ).entries


def leaderboard_page(
    session: Session,
    experiment: Experiment,
    window_seconds: int,
    *,
    with_flags: bool = False,
    limit: int = LEADERBOARD_LIMIT,
    offset: int = 0,
    after: Cursor | None = None,
) -> LeaderboardPage:
    """One page of the volunteers by verified samples (then claimed, then name), with what they claimed beside
    it; ``rank`` is the place on the whole board. ``with_flags`` adds the organizer's view of implausible
    claims. Reads the running totals (``VolunteerTotal``) through their ranking index, in one statement: the
    cost is the page's, not the number of volunteers or reports, when the page starts ``after`` a cursor; an
    ``offset`` walks the index (the index alone) up to the page. The page's cursor leads to the next page."""
    since = _active_since(window_seconds)
    params: dict[str, Any] = {"experiment_id": experiment.id, "since": since, "limit": limit + 1}
    if after is not None:
        kind = "after"
        params.update(verified=after.verified, claimed=after.claimed, sort_name=after.sort_name, user_id=after.user_id)
        first_rank = after.rank + 1
    else:
        kind = "deep" if offset >= KEYS_ONLY_FROM else "top"
        params["offset"] = offset
        first_rank = offset + 1
    rows = session.execute(_PAGES[kind, with_flags], params).all()
    more, rows = len(rows) > limit, rows[:limit]
    if not rows:
        return LeaderboardPage(entries=[], next_cursor=None)
    next_cursor = Cursor.of(first_rank + len(rows) - 1, rows[-1]).encode() if more else None
    total_verified = rows[0].total_verified or 0
    references = (
        _ClassReferences(session, experiment.id, json.loads(rows[0].signed_peaks or "{}")) if with_flags else None
    )
    board = []
    for rank, row in enumerate(rows, start=first_rank):
        seen = [t for t in (row.last_report_at, row.last_signed_at) if t is not None]
        last_seen = max(seen) if seen else None
        board.append(
            LeaderboardEntry(
                rank=rank,
                username=row.username,
                samples=row.verified_samples,
                pending_samples=row.pending_samples,
                claimed_samples=row.claimed_samples,
                share=round(row.verified_samples / total_verified, 4) if total_verified else 0.0,
                samples_per_second=round(float(row.rate or 0.0), 2),
                time_online_seconds=round(row.online_seconds, 1),
                active=last_seen is not None and last_seen >= since,
                last_seen=last_seen,
                flags=_flags(experiment, row, references) if references is not None else None,
            )
        )
    return LeaderboardPage(entries=board, next_cursor=next_cursor)


@lru_cache(maxsize=4096)
def device_classes_of(text: str | None) -> tuple[str, ...]:
    """A volunteer's device classes, sorted, from the column's JSON text."""
    return tuple(sorted(json.loads(text))) if text else ()


# The fastest signed rates here, through ix_volunteer_totals_signed_peak
_FASTEST = (
    select(
        _VOLUNTEERS.c.peak_signed_samples_per_second,
        _VOLUNTEERS.c.user_id,
        cast_(_VOLUNTEERS.c.device_classes, Text),
    )
    .where(
        _VOLUNTEERS.c.experiment_id == bindparam("experiment_id", type_=Integer),
        _VOLUNTEERS.c.peak_signed_samples_per_second > 0,
    )
    .order_by(_VOLUNTEERS.c.peak_signed_samples_per_second.desc())
    .limit(bindparam("scan", type_=Integer))
)


class _ClassReferences:
    """The fastest signed rate of each device class here (kept in the experiment's totals), and, for the
    volunteer who holds it, the runner-up: the fastest signed rate of *another* volunteer of the class, so that
    inflated signed records are not their own yardstick. The runner-ups of every class come from one read of the
    fastest volunteers through the index on the signed peak (a few rows), made once per page and only when a
    volunteer on it holds a class's peak."""

    SCAN = 50  # rows of the fastest volunteers looked through for the classes' two fastest

    def __init__(self, session: Session, experiment_id: int, fastest: dict[str, float]):
        self.session = session
        self.experiment_id = experiment_id
        self.fastest = fastest
        self._leaders: dict[str, list[tuple[float, int]]] | None = None  # class -> its two fastest (peak, user)

    def others(self, cls: str, row: TotalRow) -> float:
        fastest = self.fastest.get(cls, 0.0)
        if row.peak_signed_samples_per_second < fastest:
            return fastest  # someone else holds the class's peak
        if self._leaders is None:
            self._leaders = {}
            fastest_rows = self.session.execute(_FASTEST, {"experiment_id": self.experiment_id, "scan": self.SCAN})
            for peak, user_id, classes in fastest_rows:
                for each in device_classes_of(classes):
                    leaders = self._leaders.setdefault(each, [])
                    if len(leaders) < 2:
                        leaders.append((peak, user_id))
        # Tied at the peak, the other holder is the runner-up: the same rate.
        return next((peak for peak, user_id in self._leaders.get(cls, []) if user_id != row.user_id), 0.0)


def _flags(experiment: Experiment, row: TotalRow, references: _ClassReferences) -> list[str]:
    """Claims the signed records do not back: samples that never reached an averaging round, a reported rate
    far above what peers of the same device class were seen to do here, and signed records whose rate is far
    above every other peer of the class."""
    flags = []
    backed = row.verified_samples + row.pending_samples
    # What the monitor cannot have seen: each epoch's last moments at the peer's rate, plus reporting lag.
    unseen = row.epochs * contributions.MONITOR_SECONDS * row.peak_signed_samples_per_second
    if row.claimed_samples > backed * (1 + CLAIM_SLACK) + unseen + 2 * experiment.target_batch_size:
        flags.append(
            f"claims {row.claimed_samples:,} samples but the swarm's signed records show {backed:,}: "
            "the rest never reached an averaging round"
        )
    claimed, signed = row.peak_claimed_samples_per_second, row.peak_signed_samples_per_second
    classes = device_classes_of(row.device_classes)
    for cls in classes:
        fastest = references.fastest.get(cls, 0.0)
        if fastest > 0 and claimed > THROUGHPUT_FACTOR * fastest:
            flags.append(
                f"reported {claimed:,.0f} samples/s; the fastest signed rate of a {cls} peer here is {fastest:,.0f}"
            )
    # The signed peak may come from any of the volunteer's devices: held against the most capable of their
    # classes, and only when every one of them has another peer to compare with.
    others = [references.others(cls, row) for cls in classes] if signed > 0 else []
    if others and min(others) > 0 and signed > SIGNED_FACTOR * max(others):
        flags.append(
            f"signed records show {signed:,.0f} samples/s; no other {'/'.join(classes)} peer here signed more "
            f"than {max(others):,.0f}"
        )
    if row.swarm_flags:
        flags.append(
            f"the server's peers refused data from their peers {row.swarm_flags:,} times (non-finite gradients, an "
            "epoch ahead of the swarm, a poisoned state, or a weight claimed far over the target batch)"
        )
    return flags


def _summary_statement() -> Select[Any]:
    run, totals = _RUNS.c, _TOTALS.c
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
        active.outerjoin(_TOTALS, totals.experiment_id == experiment_id)
    )


_SUMMARY = _summary_statement()


def summary(session: Session, experiment: Experiment, window_seconds: int, swarm_peers: int | None = None) -> Summary:
    """The experiment's running totals, and the workers that reported within the window (an index range), in
    one statement."""
    row = session.execute(_SUMMARY, {"experiment_id": experiment.id, "since": _active_since(window_seconds)}).one()
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
    bucket = _BUCKETS.c
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
    clock = (now or utcnow()).timestamp()
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
