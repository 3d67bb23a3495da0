"""Migrations are the only way the schema changes: after upgrading, the models and the database agree, and a
migration that fills a new column from existing rows fills it as the code would have."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from swarmhub.server.core.db import alembic_config, make_engine
from swarmhub.server.models import Base, Experiment, MetricPoint, User, WorkerRun

pytestmark = pytest.mark.both_databases  # migrations run on both databases' DDL


def test_migrations_match_models(database_url):
    engine = make_engine(database_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []


def test_0011_backfills_each_runs_newest_report_arrival_and_downgrades(empty_database):
    engine = empty_database
    config = alembic_config(engine)
    command.upgrade(config, "0010")
    t0 = datetime(2026, 12, 2, 8, 0, 0, 123_456, tzinfo=timezone.utc)
    experiment_fields = {
        "title": "Experiment",
        "task": "digits",
        "optimizer": "lamb",
        "learning_rate": 0.01,
        "target_batch_size": 128,
        "matchmaking_time": 2.0,
        "averaging_timeout": 30.0,
        "signing_key": "key",
    }
    # Arrival order is not seq order: run "a" receives a late report (seq 1) last.
    points = {"a": [(0, 5.0), (2, 17.5), (1, 42.25)], "b": [(0, 3.0)], "d": [(7, 61.0)], "c": []}
    with engine.begin() as conn:
        conn.execute(sa.insert(User.__table__), [{"id": 1, "username": "olga", "password_hash": "x"}])
        conn.execute(
            sa.insert(Experiment.__table__),
            [
                {"id": eid, "slug": f"exp-{eid}", "owner_id": 1, "invite_code": f"code-{eid}", **experiment_fields}
                for eid in (1, 2)
            ],
        )
        runs = [{"id": run, "experiment_id": 2 if run == "d" else 1, "user_id": 1, "device": "cpu"} for run in points]
        conn.execute(sa.insert(WorkerRun.__table__), runs)
        conn.execute(
            sa.insert(MetricPoint.__table__),
            [
                {
                    "experiment_id": 2 if run == "d" else 1,
                    "worker_run_id": run,
                    "seq": seq,
                    "received_at": t0 + timedelta(seconds=seconds),
                    "step": seq,
                    "epoch": 0,
                    "samples": 10 * (seq + 1),
                    "loss": 2.0,
                    "samples_per_second": 1.0,
                    "peers": 2,
                    "averaged_peers": 2,
                }
                for run, reports in points.items()
                for seq, seconds in reports
            ],
        )
    assert "last_stored_at" not in {c["name"] for c in sa.inspect(engine).get_columns("worker_runs")}

    command.upgrade(config, "0011")
    with engine.connect() as conn:
        backfilled = dict(conn.execute(sa.select(WorkerRun.id, WorkerRun.last_stored_at)).tuples().all())
    assert backfilled == {
        "a": t0 + timedelta(seconds=42.25),
        "b": t0 + timedelta(seconds=3.0),
        "c": None,
        "d": t0 + timedelta(seconds=61.0),
    }

    command.downgrade(config, "0010")
    columns = {c["name"] for c in sa.inspect(engine).get_columns("worker_runs")}
    assert "last_stored_at" not in columns and {"id", "last_seen_at", "last_seq"} <= columns
    with engine.connect() as conn:
        assert sorted(conn.scalars(sa.text("SELECT id FROM worker_runs"))) == ["a", "b", "c", "d"]
        # SQLite rebuilds the table to drop the column: the rows that refer to it stay (foreign keys are off
        # while a migration changes tables, see migrations/env.py)
        stored = conn.scalar(sa.text("SELECT count(*) FROM metric_points"))
        assert stored == sum(len(reports) for reports in points.values())
        if engine.dialect.name == "sqlite":  # and are on again afterwards
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1


def test_0022_adds_each_runs_peer_and_reported_figures_and_downgrades(empty_database):
    engine = empty_database
    config = alembic_config(engine)
    command.upgrade(config, "0021")
    new = {"peer_id", "precision", "client_mode", "role", "bandwidth_mbps"}
    experiment = {
        "id": 1,
        "slug": "exp",
        "owner_id": 1,
        "invite_code": "code",
        "title": "Experiment",
        "task": "digits",
        "optimizer": "adam",
        "learning_rate": 0.001,
        "target_batch_size": 128,
        "matchmaking_time": 2.0,
        "averaging_timeout": 30.0,
        "signing_key": "key",
    }
    with engine.begin() as conn:  # the model's insert names only the columns it is given or has defaults for
        conn.execute(sa.insert(User.__table__), [{"id": 1, "username": "olga", "password_hash": "x"}])
        conn.execute(sa.insert(Experiment.__table__), [experiment])
        conn.execute(
            sa.insert(WorkerRun.__table__), [{"id": "old", "experiment_id": 1, "user_id": 1, "device": "cuda"}]
        )

    command.upgrade(config, "0022")
    inspector = sa.inspect(engine)
    assert new <= {c["name"] for c in inspector.get_columns("worker_runs")}
    assert "ix_worker_runs_peer_id" in {i["name"] for i in inspector.get_indexes("worker_runs")}
    figures = [WorkerRun.id, WorkerRun.device, *(getattr(WorkerRun, name) for name in sorted(new))]
    with engine.begin() as conn:
        assert conn.execute(sa.select(*figures)).tuples().all() == [("old", "cuda", None, None, None, None, None)]
        reported = {"peer_id": "QmPeer", "precision": "fp32", "client_mode": True, "role": "trainer"}
        run = {"id": "new", "experiment_id": 1, "user_id": 1, "device": "cpu", "bandwidth_mbps": 87.5, **reported}
        conn.execute(sa.insert(WorkerRun.__table__), [run])
        assert conn.execute(sa.select(*figures).where(WorkerRun.id == "new")).tuples().one() == (
            "new",
            "cpu",
            87.5,
            True,
            "QmPeer",
            "fp32",
            "trainer",
        )

    command.downgrade(config, "0021")
    inspector = sa.inspect(engine)
    columns = {c["name"] for c in inspector.get_columns("worker_runs")}
    assert not new & columns and {"id", "device", "last_stored_at", "last_seq"} <= columns
    indexes = {i["name"] for i in inspector.get_indexes("worker_runs")}
    assert "ix_worker_runs_peer_id" not in indexes and "ix_worker_runs_experiment_seen" in indexes
    with engine.connect() as conn:
        assert sorted(conn.scalars(sa.text("SELECT id FROM worker_runs"))) == ["new", "old"]
    command.upgrade(config, "head")  # and up again
    assert new <= {c["name"] for c in sa.inspect(engine).get_columns("worker_runs")}
