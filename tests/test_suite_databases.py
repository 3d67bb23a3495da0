"""The suite's PostgreSQL databases are each test process's own: two runs on one machine (two checkouts, two
containers whose test processes have the same process id, a run's lanes) never share one, and a run never drops
another's. Each is dropped when its run ends."""

from __future__ import annotations

import os

import pytest
import sqlalchemy as sa

from swarmhub.server.core.db import make_engine

from .conftest import POSTGRES_URL, _drop_postgres, _prepare_postgres


def databases() -> set[str]:
    admin = make_engine(POSTGRES_URL.rsplit("/", 1)[0] + "/postgres")
    try:
        with admin.connect() as conn:
            return set(conn.execute(sa.text("SELECT datname FROM pg_database")).scalars())
    finally:
        admin.dispose()


def test_two_runs_with_one_process_id_get_databases_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Test processes in two containers on one PostgreSQL server can have the same process id (often a small
    one): the second run's database is not the first's, and preparing it leaves the first's data alone."""
    monkeypatch.setattr(os, "getpid", lambda: 7)
    first = _prepare_postgres(POSTGRES_URL)
    try:
        engine = make_engine(first)
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE kept (n integer)"))
                conn.execute(sa.text("INSERT INTO kept VALUES (42)"))
            second = _prepare_postgres(POSTGRES_URL)  # the other run, starting while the first one works
            try:
                assert second != first
                assert {first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]} <= databases()
                with engine.connect() as conn:  # the first run's connection and data are still there
                    assert conn.execute(sa.text("SELECT n FROM kept")).scalar_one() == 42
            finally:
                _drop_postgres(second)
        finally:
            engine.dispose()
    finally:
        _drop_postgres(first)
    assert not {first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]} & databases()  # dropped at the end
