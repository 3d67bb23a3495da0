"""Shared fixtures. Database tests run on SQLite, the default database; a module whose behaviour can differ
between the databases (dialect-specific SQL, locks, collation, migrations) is marked ``both_databases`` and runs on
PostgreSQL (127.0.0.1:5432) too. ``--all-databases`` (or ``SWARMHUB_TEST_ALL_DATABASES=1``) runs every database
test on both. Each database is migrated once per session, and every table is emptied after each test so that
assertions can be exact."""

from __future__ import annotations

import os
import re
import secrets
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import uvicorn
from fastapi.testclient import TestClient

from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.app import create_app
from swarmhub.server.core.db import make_engine, migrate
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import text as corpus
from swarmhub.server.models import Base, Experiment, User
from swarmhub.server.services import services

POSTGRES_URL = os.environ.get(
    "SWARMHUB_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/swarmhub_test"
)
PASSWORD = "correct-horse-battery"
_CPU_AT_START = pytest.StashKey[float]()
DOCSTRING_BYTES = 150_000  # of the standard library's docstrings: real text, bounded for speed


def private_database_name(base_name: str) -> str:
    """A database name of this test process's own: ``base_name``, the process id and a random suffix. The process
    id alone is not enough: runs in two containers against one PostgreSQL server (or a run and a stale database
    of a run that died) can share it, and each run's lanes (tests/lanes.py) are processes of their own."""
    return f"{base_name}_{os.getpid()}_{secrets.token_hex(4)}"


def _prepare_postgres(url: str) -> str:
    """A new database of this test process's own, named after the URL's (:func:`private_database_name`), and its
    URL; dropped by :func:`_drop_postgres`. Never another run's: a name that exists already is not dropped but
    passed over for a new one. Skipped only outside CI when no server answers."""
    server, base_name = url.rsplit("/", 1)
    admin = make_engine(server + "/postgres")
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            for _ in range(5):
                db_name = private_database_name(base_name)
                try:
                    conn.execute(sa.text(f'CREATE DATABASE "{db_name}"'))
                    break
                except sa.exc.ProgrammingError as exc:  # DuplicateDatabase: another run's, left alone
                    if getattr(exc.orig, "sqlstate", None) != "42P04":
                        raise
            else:
                raise RuntimeError(f"no free database name after {base_name!r} in 5 tries")
    except sa.exc.OperationalError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL is not reachable at {url} ({exc.orig}); set SWARMHUB_TEST_POSTGRES_URL")
    finally:
        admin.dispose()
    return f"{server}/{db_name}"


def _drop_postgres(url: str) -> None:
    server, db_name = url.rsplit("/", 1)
    admin = make_engine(server + "/postgres")
    try:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-databases", action="store_true", help="run every database test on PostgreSQL as well as SQLite"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "both_databases: behaviour can differ between SQLite and PostgreSQL: run on both"
    )


def _cpu_seconds() -> float:
    """User and system CPU time of this process and of the processes it has waited for (they include theirs)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    item.stash[_CPU_AT_START] = _cpu_seconds()
    free_hivemind_locks()
    yield


def free_hivemind_locks() -> None:
    """Give hivemind's process-wide MPFuture locks back when a process that died holding one left them taken.

    hivemind creates them once, at import (``MPFuture._update_lock``, ``_initialization_lock``), and every process
    this one forks afterwards shares them. A helper process killed while it held one (an averager ended at a
    test's tear-down in the middle of sending a result) leaves it taken for good: every later hivemind process of
    this pytest process then blocks on it, and a DHT never becomes ready (one suite run hung four tests of
    ``test_schedule_offset.py`` that way, five minutes each). Between tests no hivemind process of this one is
    meant to be running, so a lock still taken after a second is a dead holder's."""
    mpfuture = sys.modules.get("hivemind.utils.mpfuture")
    if mpfuture is None:
        return
    import multiprocessing

    for name in ("_update_lock", "_initialization_lock"):
        lock = getattr(mpfuture.MPFuture, name)
        if lock.acquire(timeout=1.0):
            lock.release()
        else:
            print(f"hivemind's MPFuture.{name} was left taken by a process that ended: replaced", file=sys.stderr)
            setattr(mpfuture.MPFuture, name, multiprocessing.Lock())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each test's CPU seconds (set-up, call and tear-down) as the JUnit property ``cpu_seconds``, which
    ``tests/lanes.py`` ranks: on 2 cores the lanes share the CPU, so what a test burns slows the other lanes too.
    A lower bound: a process the test did not wait for (a daemon its peers started) is not counted."""
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_seconds", f"{_cpu_seconds() - item.stash[_CPU_AT_START]:.1f}"))
    yield


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``database_url`` is SQLite, and PostgreSQL too for ``both_databases`` tests (or with ``--all-databases``)."""
    if "database_url" not in metafunc.fixturenames:
        return
    everything = metafunc.config.getoption("--all-databases") or os.environ.get("SWARMHUB_TEST_ALL_DATABASES") == "1"
    both = everything or metafunc.definition.get_closest_marker("both_databases") is not None
    kinds = ["sqlite", "postgresql"] if both else ["sqlite"]
    metafunc.parametrize("database_url", kinds, indirect=True, scope="session")


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'test.db'}"
    else:
        url = _prepare_postgres(POSTGRES_URL)
    try:
        engine = make_engine(url)
        migrate(engine)
        engine.dispose()
        yield url
    finally:  # also when the migration failed: the database is this run's alone, and no one else drops it
        if request.param == "postgresql":
            _drop_postgres(url)


def _empty_tables(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
            conn.execute(sa.text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
        else:
            for table in reversed(Base.metadata.sorted_tables):
                conn.execute(table.delete())
    engine.dispose()


@pytest.fixture
def settings(database_url: str, tmp_path: Path) -> Iterator[Settings]:
    yield Settings(
        environment="test",
        password_hashing="minimal",  # Argon2id at its least cost: the suite creates thousands of accounts
        data_dir=tmp_path / "data",
        database_url=database_url,
        swarm_enabled=False,
        live_interval_seconds=0.2,
    )
    _empty_tables(database_url)


@pytest.fixture
def app(settings: Settings) -> Any:
    return create_app(settings)


@pytest.fixture
def client(app: Any) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


@pytest.fixture
def db(app: Any) -> Any:
    """A sessionmaker on the app's database, for factories and for checking what was stored."""
    return services(app).sessionmaker


def make_user(db: Any, username: str = "alice", password: str = PASSWORD, **overrides: Any) -> User:
    with db.begin() as session:
        return accounts.create_user(session, username, password, **overrides)


def make_experiment(
    db: Any, owner: User, slug: str = "digits-run", status: str = "draft", **overrides: Any
) -> Experiment:
    fields = {"slug": slug, "title": f"Experiment {slug}", "target_batch_size": 128, "matchmaking_time": 2.0}
    with db.begin() as session:
        owner = session.merge(owner)
        experiment = experiments.create(session, owner, experiments.ExperimentCreate(**{**fields, **overrides}))
        experiment.status = status
        return experiment


def api_token(client: TestClient, username: str = "alice", password: str = PASSWORD) -> dict[str, str]:
    """Bearer headers from the real token route."""
    response = client.post("/api/auth/token", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    return {"Authorization": f"Bearer {response.json()['access_token']}"}


def csrf_from(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "page has no CSRF field"
    return match.group(1)


def login(client: TestClient, username: str = "alice", password: str = PASSWORD) -> str:
    """Log in through the real form; returns the session's CSRF token for later forms."""
    token = csrf_from(client.get("/login").text)
    response = client.post(
        "/login", data={"username": username, "password": password, "csrf_token": token}, follow_redirects=False
    )
    assert response.status_code == 303, response.text
    return csrf_from(client.get("/account").text)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LiveServer:
    """A real uvicorn server in a thread, for clients that need a socket (CLI, browser)."""

    def __init__(self, app: Any, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture
def live_server(app: Any) -> Iterator[LiveServer]:
    with LiveServer(app) as server:
        yield server


@pytest.fixture
def swarm_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The server's bootstrap/monitor peer for a new run (``swarm_processes.running_swarm_peer``)."""
    from .swarm_processes import running_swarm_peer

    with running_swarm_peer(tmp_path_factory.mktemp("peer")) as swarm:
        yield swarm


@pytest.fixture(scope="module")
def docstrings() -> bytes:
    """Real text none of us wrote: the standard library's docstrings (bounded, for speed)."""
    return corpus.builtin_text("python-docstrings", max_bytes=DOCSTRING_BYTES).encode()


@pytest.fixture
def empty_database(database_url: str, tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on an empty database of the same kind, for driving migrations revision by revision: a new
    SQLite file, or a schema of its own in the test database on PostgreSQL (the suite's tables stay as they are)."""
    if database_url.startswith("sqlite"):
        engine = make_engine(f"sqlite:///{tmp_path / 'migrations.db'}")
        yield engine
        engine.dispose()
        return
    admin = make_engine(database_url)
    with admin.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA IF EXISTS migration_steps CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA migration_steps"))
    engine = sa.create_engine(database_url, connect_args={"options": "-c search_path=migration_steps"})
    try:
        yield engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text("DROP SCHEMA migration_steps CASCADE"))
        admin.dispose()
