"""Shared harness of the server benchmarks (``ingestion.py``, ``fanout.py``, ``memory.py``); not a benchmark.

- :func:`bench_lock`: one measured run at a time on this machine (``/tmp/swarmhub-bench-running``).
- :class:`SwarmhubServer`: a real ``swarmhub server`` process (SWARMHUB_SWARM_ENABLED=false: no hivemind peers;
  ``swarm=True`` for the swarm benchmarks, whose workers join it) on SQLite or PostgreSQL, optionally with Redis;
  an administrator made with ``swarmhub admin``, an API token from ``POST /api/auth/token`` and running
  experiments made through ``POST /api/experiments`` and its status route.
- :func:`volunteers`: volunteers with API tokens and worker runs, made with the server's own service functions
  on its database, as ``tests/test_nothing_lost.py`` makes them (``POST .../join`` needs the swarm, which
  these benchmarks leave off; the websocket checks token and worker run exactly as after a real join).
- :class:`BareServer`: the reference: a bare Starlette websocket endpoint that parses each message as JSON and
  answers an ack of the same size as swarmhub's, served by uvicorn exactly as ``swarmhub server`` serves its app
  (``python bench/_server.py bare --port N``).
- :func:`postgres_database`: a throw-away PostgreSQL database, dropped at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import _common as c
import httpx
import psutil

SWARMHUB_CLI = [sys.executable, "-m", "swarmhub.worker.cli.main"]
LOCK = "/tmp/swarmhub-bench-running"  # noqa: S108 - the machine-wide "a benchmark is being measured" flag
POSTGRES_ADMIN = os.environ.get("SWARMHUB_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("SWARMHUB_BENCH_REDIS", "redis://127.0.0.1:6379/0")
PASSWORD = "bench-" + secrets.token_urlsafe(12)
WS_MAX_SIZE = 64 * 1024  # what `swarmhub server` gives uvicorn (server/cli.py)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def raise_open_files(wanted: int = 20_000) -> int:
    """Raise this process's open-files limit (children inherit it); returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@contextlib.contextmanager
def bench_lock(timeout: float = 3600) -> Iterator[None]:
    """Wait until no other benchmark is being measured on this machine, then hold the flag file."""
    deadline = time.monotonic() + timeout
    told = False
    while True:
        try:
            fd = os.open(LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            if not told:
                print(f"waiting for {LOCK} to go (another benchmark is being measured)", flush=True)
                told = True
            if time.monotonic() > deadline:
                raise c.BenchError(f"{LOCK} still there after {timeout:.0f} s") from None
            time.sleep(2)
    os.write(fd, f"{os.getpid()} {' '.join(sys.argv)}\n".encode())
    os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(LOCK)


@contextlib.contextmanager
def postgres_database(prefix: str) -> Iterator[str]:
    """A fresh PostgreSQL database (its SQLAlchemy URL), dropped afterwards."""
    import sqlalchemy as sa

    name = f"swarmhub_bench_{prefix}_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(f"{POSTGRES_ADMIN}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        raise c.BenchError(f"PostgreSQL is not reachable at {POSTGRES_ADMIN} ({exc.orig})") from None
    try:
        yield f"{POSTGRES_ADMIN}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def redis_available() -> bool:
    import redis

    try:
        client = redis.from_url(REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
        client.ping()
        client.close()
        return True
    except redis.RedisError:
        return False


class SwarmhubServer:
    """``swarmhub server`` in its own process, with an administrator who organizes experiments.

    ``admin=False`` for a second process on a database that already has one. ``swarm=True`` runs each started
    experiment's swarm peers (bootstrap/monitor, and the witness where the experiment has ``aux_peer``) on
    127.0.0.1, as a real server does; without it the server runs no hivemind peer."""

    def __init__(
        self, h: c.Harness, name: str, database_url: str, *, admin: bool = True, swarm: bool = False, **env: str
    ):
        self.h = h
        self.name = name
        self.database_url = database_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        self.env = h.env(
            SWARMHUB_DATA_DIR=str(h.tmp / f"{name}-data"),
            SWARMHUB_DATABASE_URL=database_url,
            SWARMHUB_SWARM_ENABLED="true" if swarm else "false",
            **({"SWARMHUB_SWARM_HOST": "127.0.0.1"} if swarm else {}),
            **env,
        )
        if admin:
            made = subprocess.run(
                [*SWARMHUB_CLI, "admin", "bench", "--password-stdin"],
                input=PASSWORD + "\n",
                env=self.env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            if made.returncode != 0:
                raise c.BenchError(f"swarmhub admin failed: {made.stderr[-2000:]}")
        argv = [*SWARMHUB_CLI, "server", "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "warning"]
        self.proc = h.spawn(name, argv, env=self.env, stop_signal=signal.SIGTERM)
        c.wait_healthy(self.url, self.proc.popen, 90, self.proc.log)
        response = httpx.post(f"{self.url}/api/auth/token", json={"username": "bench", "password": PASSWORD})
        response.raise_for_status()
        self.token = response.json()["access_token"]
        self.http = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    @property
    def pid(self) -> int:
        return self.proc.popen.pid

    def start_experiment(self, prefix: str = "bench", experiment: dict[str, Any] | None = None) -> str:
        """A running experiment (``experiment``: the fields of :func:`_common.experiment_config`; a small digits
        experiment by default), made and started through the API; returns its slug."""
        slug = f"{prefix}-{uuid.uuid4().hex[:8]}"
        exp = experiment or c.experiment_config(hidden_size=64, batch_size=64, target_batch_size=4096)
        created = self.http.post("/api/experiments", json={"slug": slug, "title": "Server benchmark", **exp})
        if created.status_code != 201:
            raise c.BenchError(f"could not create the experiment: {created.status_code} {created.text[:500]}")
        started = self.http.post(f"/api/experiments/{slug}/status", json={"action": "start"})
        if started.status_code != 200 or started.json().get("status") != "running":
            raise c.BenchError(f"could not start the experiment: {started.status_code} {started.text[:500]}")
        return slug

    def finish(self, slug: str) -> None:
        self.http.post(f"/api/experiments/{slug}/status", json={"action": "finish"})

    def peer_processes(self, modules: tuple[str, ...]) -> list[tuple[str, psutil.Process]]:
        """The server's peer processes run as ``swarmhub.server.swarm.<module>`` for one of ``modules``: (module,
        process) each."""
        found = []
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(self.pid).children():
                with contextlib.suppress(psutil.Error):
                    command = " ".join(child.cmdline())
                    found += [(m, child) for m in modules if f"swarmhub.server.swarm.{m}" in command][:1]
        return found

    def monitor_seconds(self, modules: tuple[str, ...] = ("bootstrap_peer",)) -> float:
        """CPU seconds so far of the server's peers run as ``swarmhub.server.swarm.<module>`` (by default its
        monitor peers, ``bootstrap_peer``) and of what they forked (DHT, averagers, ``p2pd``)."""
        total = 0.0
        for _, child in self.peer_processes(modules):
            with contextlib.suppress(psutil.Error):
                for p in [child, *child.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        t = p.cpu_times()
                        total += t.user + t.system
        return total

    def close(self) -> None:
        self.http.close()


class BareServer:
    """The reference endpoint (see :func:`bare_app`) in its own uvicorn process."""

    def __init__(self, h: c.Harness, name: str = "bare"):
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.ws_url = f"ws://127.0.0.1:{self.port}"
        argv = [sys.executable, os.path.abspath(__file__), "bare", "--port", str(self.port)]
        self.proc = h.spawn(name, argv, stop_signal=signal.SIGTERM)
        c.wait_healthy(self.url, self.proc.popen, 90, self.proc.log)

    @property
    def pid(self) -> int:
        return self.proc.popen.pid


def volunteers(database_url: str, slug: str, workers: int, per_user: int = 10) -> list[tuple[str, str]]:
    """``workers`` worker runs of ``slug`` (``per_user`` per volunteer, each volunteer with an API token), made
    with the server's service functions; returns (worker_id, token) pairs."""
    from swarmhub.server import experiments
    from swarmhub.server.accounts import users as accounts
    from swarmhub.server.core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    made: list[tuple[str, str]] = []
    try:
        with make_sessionmaker(engine).begin() as session:
            experiment = experiments.get_visible(session, slug, None)
            for u in range((workers + per_user - 1) // per_user):
                user = accounts.create_user(session, f"v{uuid.uuid4().hex[:10]}{u}", secrets.token_urlsafe(12))
                token, _ = accounts.issue_token(session, user, "bench worker")
                for _ in range(min(per_user, workers - len(made))):
                    run = experiments.start_worker_run(session, experiment, user, "cpu")
                    made.append((run.id, token))
    finally:
        engine.dispose()
    return made


def seed_history(database_url: str, slug: str, workers: int = 8, seconds: int = 2700, every: int = 2) -> int:
    """``seconds`` of history: reports from ``workers`` earlier worker runs (one every ``every`` s in all), stored by
    the server's own ``metrics.ingest`` with its clock set back, so the dashboard's series (45 minutes: its finest
    resolution, full) and leaderboard have their production size, in whatever ``ingest`` maintains."""
    from datetime import timedelta

    from swarmhub.common.protocol import MetricReport
    from swarmhub.server import metrics
    from swarmhub.server.core.db import make_engine, make_sessionmaker
    from swarmhub.server.models import WorkerRun

    runs = volunteers(database_url, slug, workers, per_user=1)
    engine = make_engine(database_url)
    real_clock = metrics.clock.utcnow
    start = real_clock() - timedelta(seconds=seconds + 60)
    try:
        with make_sessionmaker(engine).begin() as session:
            for n, i in enumerate(range(0, seconds, every)):
                worker = session.get(WorkerRun, runs[n % workers][0])
                assert worker is not None
                metrics.clock.utcnow = lambda i=i: start + timedelta(seconds=i)  # type: ignore[misc]
                report = MetricReport.model_validate_json(report_message(n // workers, loss=3.0 - i / seconds))
                metrics.ingest(session, worker, report)
    finally:
        metrics.clock.utcnow = real_clock  # type: ignore[misc]
        engine.dispose()
    return len(range(0, seconds, every))


def stored_reports(database_url: str, slug: str) -> int:
    """Metric reports stored for ``slug`` (rows in the database)."""
    import sqlalchemy as sa

    from swarmhub.server.core.db import make_engine
    from swarmhub.server.models import Experiment, MetricPoint

    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count(MetricPoint.id))
                    .join(Experiment, Experiment.id == MetricPoint.experiment_id)
                    .where(Experiment.slug == slug)
                ).scalar_one()
            )
    finally:
        engine.dispose()


def report_message(seq: int, samples: int | None = None, loss: float = 2.0) -> str:
    """One valid ``MetricReport`` as JSON (the fields the worker sends)."""
    return json.dumps(
        {
            "type": "metrics",
            "seq": seq,
            "step": seq,
            "epoch": seq // 10,
            "samples": samples if samples is not None else 64 * (seq + 1),
            "loss": loss,
            "samples_per_second": 640.0,
            "peers": 8,
            "averaged_peers": 4,
        }
    )


def cpu_seconds(pid: int) -> float:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except psutil.Error:
        return float("nan")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def emit(**event: Any) -> None:
    """A JSON line on stdout for the harness's :class:`_common.LineReader`."""
    print(json.dumps(event), flush=True)


# -- the reference endpoint ---------------------------------------------------------------------------------


def bare_app() -> Any:
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route, WebSocketRoute
    from starlette.websockets import WebSocket, WebSocketDisconnect

    async def report(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            while True:
                message = json.loads(await websocket.receive_text())
                await websocket.send_text(json.dumps({"type": "ack", "seq": message["seq"]}, separators=(",", ":")))
        except WebSocketDisconnect:
            pass

    async def healthz(request: Any) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[Route("/healthz", healthz), WebSocketRoute("/ws/experiments/{slug}/report", report)])


def _serve_bare(port: int) -> None:
    import uvicorn

    uvicorn.run(bare_app(), host="127.0.0.1", port=port, log_level="warning", ws_max_size=WS_MAX_SIZE)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "bare" and sys.argv[2] == "--port":
        _serve_bare(int(sys.argv[3]))
    else:
        sys.exit("usage: python bench/_server.py bare --port N")
