"""The write path: metric reports stored exactly once (a binary COPY on PostgreSQL), the time buckets they fall
in upserted, and the worker runs' latest numbers and the volunteers' and experiment's running totals kept in
step, with a few Core statements per batch."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Float,
    Integer,
    String,
    Table,
    TypeDecorator,
    bindparam,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.common.protocol import MetricReport
from swarmhub.server.metrics.buckets import Buckets
from swarmhub.server.metrics.common import (
    POINTS_TABLE,
    RUNS_TABLE,
    TOTALS_TABLE,
    VOLUNTEERS_TABLE,
    among,
    current_time,
    device_class,
)
from swarmhub.server.models import ExperimentTotal, User, VolunteerTotal, WorkerRun

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


_UPDATE_RUNS = _update_by_key(RUNS_TABLE, ("id",), _RUN_COLUMNS)
_UPDATE_VOLUNTEERS = _update_by_key(VOLUNTEERS_TABLE, ("experiment_id", "user_id"), _VOLUNTEER_COLUMNS)
_UPDATE_TOTALS = _update_by_key(TOTALS_TABLE, ("experiment_id",), _TOTAL_COLUMNS[:2])
_UPDATE_PEAKS = _update_by_key(TOTALS_TABLE, ("experiment_id",), _TOTAL_COLUMNS[2:])


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


_UPDATE_RUNS_FROM_ARRAYS = _update_from_arrays(RUNS_TABLE, "id", _RUN_COLUMNS)


def _insert_points(insert: Any, returning: bool) -> Any:
    stmt = insert(POINTS_TABLE).on_conflict_do_nothing(index_elements=["worker_run_id", "seq"])
    return stmt.returning(POINTS_TABLE.c.worker_run_id, POINTS_TABLE.c.seq) if returning else stmt


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
_COPY_POINTS = f"COPY {POINTS_TABLE.name} ({', '.join(_POINT_COLUMNS)}) FROM STDIN (FORMAT BINARY)"


def _binary_copy_type(column: Any) -> str:
    """The PostgreSQL type a binary COPY sends for a column (it must be the column's own)."""
    kind = column.type.impl if isinstance(column.type, TypeDecorator) else column.type
    for sql_type, name in ((BigInteger, "int8"), (Integer, "int4"), (String, "varchar"), (Float, "float8")):
        if isinstance(kind, sql_type):
            return name
    if isinstance(kind, DateTime) and kind.timezone:
        return "timestamptz"
    raise TypeError(f"no binary COPY type for {column}")


_COPY_TYPES = [_binary_copy_type(POINTS_TABLE.c[column]) for column in _POINT_COLUMNS]


def _copy_points(session: Session, points: list[dict[str, Any]]) -> None:
    """PostgreSQL: new metric points with one binary COPY, in the session's transaction: it costs the database
    and the server about half of an executemany INSERT (docs/benchmarks/server.md). Like that INSERT, it fails
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
        select(TOTALS_TABLE.c.experiment_id, *(TOTALS_TABLE.c[column] for column in _TOTAL_COLUMNS))
        .where(TOTALS_TABLE.c.experiment_id == experiment_id)
        .with_for_update()
    )
    row = session.execute(stmt).one_or_none()
    if row is None:
        session.execute(insert(TOTALS_TABLE).values(experiment_id=experiment_id).on_conflict_do_nothing())
        row = session.execute(stmt).one()
    return _Totals(row)


def ingest(session: Session, worker: WorkerRun, report: MetricReport) -> bool:
    """Store one report exactly once, and keep the run's latest numbers and the volunteer's and experiment's
    running totals in step. Returns False for a duplicate (already stored) message."""
    return ingest_many(session, [(worker.id, report, current_time())])[0]


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
            session.scalars(
                select(RUNS_TABLE.c.experiment_id).where(among(RUNS_TABLE.c.id, run_ids, dialect)).distinct()
            )
        )
    totals = {eid: _lock_totals(session, eid, insert) for eid in sorted(experiment_ids)}
    run_rows = session.execute(
        select(
            RUNS_TABLE.c.id,
            RUNS_TABLE.c.experiment_id,
            RUNS_TABLE.c.user_id,
            RUNS_TABLE.c.device,
            *(RUNS_TABLE.c[c] for c in _RUN_COLUMNS),
        ).where(among(RUNS_TABLE.c.id, run_ids, dialect))
    )
    runs = {row.id: _Run(row) for row in run_rows}
    if len(runs) < len(run_ids):  # removed meanwhile (its experiment was deleted)
        raise LookupError(f"unknown worker runs {sorted(run_ids - runs.keys())}")
    volunteers: dict[tuple[int, int], _Volunteer] = {}
    for eid in totals:
        users = {run.user_id for run in runs.values() if run.experiment_id == eid}
        found = session.execute(
            select(
                VOLUNTEERS_TABLE.c.user_id,
                VOLUNTEERS_TABLE.c.peak_signed_samples_per_second,
                *(VOLUNTEERS_TABLE.c[c] for c in _VOLUNTEER_COLUMNS),
            ).where(VOLUNTEERS_TABLE.c.experiment_id == eid, among(VOLUNTEERS_TABLE.c.user_id, users, dialect))
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

    buckets = Buckets()
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
        session.execute(insert(VOLUNTEERS_TABLE), [{**r, "sort_name": names[r["user_id"]].lower()} for r in added])
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
