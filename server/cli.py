"""Server-side commands behind the `swarmhub` console script: server, admin, demo.

The worker's CLI imports this module lazily, so a volunteer's base install never needs it.
"""

from __future__ import annotations

import contextlib
import gc
import getpass
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import httpx
from pydantic import ValidationError
from sqlalchemy import func

from swarmhub.common.protocol import OptimizerName
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.core.db import make_engine, make_sessionmaker, migrate
from swarmhub.server.core.errors import AppError
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import image_data, training_data
from swarmhub.server.corpus import text as corpus
from swarmhub.server.models import User
from swarmhub.worker import transport


def load_settings(**overrides: Any) -> Settings:
    """The server's settings from the environment, or one line per bad setting and exit status 2."""
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            name = f"SWARMHUB_{where.upper()}" if where else "settings"
            message = error["msg"].removeprefix("Value error, ")
            lines.append(message if message.startswith(name) else f"{name}: {message}")
        raise click.UsageError("invalid settings:\n  " + "\n  ".join(lines)) from None


def run_server(host: str, port: int, database_url: str | None, log_level: str = "info") -> None:
    import uvicorn

    from swarmhub.server.app import create_app

    settings = load_settings(database_url=database_url)
    click.echo(f"swarmhub on http://{host}:{port} (database: {_redact(settings.database_url)})")
    # X-Forwarded-For is read by the app only, from SWARMHUB_TRUSTED_PROXIES (server/core/proxies.py): uvicorn's own
    # reading believes any connection from 127.0.0.1.
    app = create_app(settings)
    # What is alive now (modules, routes, templates, table metadata) lives as long as the process: moved out of the
    # collector's reach, so that its full collections, which stop every request and every live push while they
    # run, scan only what serving allocates.
    gc.collect()
    gc.freeze()
    uvicorn.run(app, host=host, port=port, log_level=log_level, ws_max_size=64 * 1024, proxy_headers=False)


def _redact(url: str) -> str:
    """Never print a database password."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def run_admin(username: str, password_stdin: bool) -> None:
    """Create an administrator, or make an existing user one (optionally setting a new password)."""
    settings = load_settings()
    engine = make_engine(settings.database_url)
    migrate(engine)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = getpass.getpass("Password (empty keeps an existing user's): ")
    try:
        with make_sessionmaker(engine).begin() as session:
            user = session.query(User).filter(func.lower(User.username) == username.strip().lower()).one_or_none()
            if user is None:
                accounts.create_user(session, username, password, is_admin=True)
                click.echo(f"Created administrator {username}.")
            else:
                user.is_admin = True
                if password:
                    ended, revoked = accounts.set_password(session, user, password)
                    click.echo(
                        f"New password set for {username}: {ended} browser session(s) ended and {revoked} API "
                        "token(s) revoked (log in again, and run `swarmhub login` on each worker)."
                    )
                click.echo(f"{username} is now an administrator.")
    except (AppError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        engine.dispose()


DEMO_SLUG = "demo-albert"
DEMO_EXPERIMENTS = ("demo-albert", "demo-digits", "demo-swav")
DEMO_TEXT_BYTES = 2_000_000  # of the standard library's docstrings: a tokenizer and shards in seconds
DEMO_CORPUS = training_data.CorpusOptions(vocab_size=4000, seq_length=64)
# The demo's ALBERT experiment, chosen with bench/albert_settings.py (held-out loss at equal samples against the
# unigram baseline; docs/benchmarks/demo-albert.md): LAMB learns context only with enough steps, and a collaborative
# batch of 256 reached 0.5 nats under the baseline with about 60% of the samples 512 needed, more than its rounds'
# cost. 256 per half second caps the swarm at 512 samples/s: both demo peers (about 150-270 samples/s each on 2
# cores) train unthrottled. The decay ends at step 2,000 (beyond the 25 minutes measured): the docstrings are 6,700
# training sequences, passed over about 45 times in 25 minutes.
DEMO_ALBERT: dict[str, Any] = {
    "task": "albert-mlm",
    "task_params": {"size": "tiny", "batch_size": 16, "warmup_steps": 10, "total_steps": 2000},
    "optimizer": OptimizerName.lamb,
    "learning_rate": 0.02,
    "target_batch_size": 256,
    "matchmaking_time": 0.5,
    "averaging_timeout": 30.0,
}

# The demo's SwAV experiment, chosen with bench/swav_settings.py (docs/swav.md): the tiny backbone on the built-in
# shapes, crops and evaluation in grey (the shapes' colours are random: in colour the backbone learns colour, and
# SwAV's colour jitter makes it predict every prototype alike), Adam, and a collaborative batch both demo peers
# fill in about a second (at 256, a rate of 5e-3 gained 25 points of k-NN accuracy in 300 steps, 2e-3 18). A
# constant rate: one demo with the rate falling to a tenth over 300 steps (decay_steps) gained 2.5 points in 10
# minutes, one at a constant rate 14.8 to 26.6 (docs/swav.md).
DEMO_SWAV: dict[str, Any] = {
    "task": "swav",
    "task_params": {
        "colour": "grey",
        "prototypes": 32,
        "queue_length": 512,
        "queue_starts_after": 20,
        "freeze_prototypes_steps": 20,
    },
    "optimizer": OptimizerName.adam,
    "learning_rate": 0.005,
    "target_batch_size": 256,
    "matchmaking_time": 0.5,
    "averaging_timeout": 30.0,
}


def _seed_demo(settings: Settings, experiment: str = DEMO_SLUG) -> tuple[str, list[str]]:
    """A demo organizer, two volunteers with tokens and the two demo experiments: the paper's workload (a tiny
    ALBERT pretrained on the Python standard library's docstrings, with a tokenizer trained on them) and
    handwritten digits. Only ``experiment``, the one the demo's workers train, is started (and only the ALBERT
    one's text is prepared, a tokenizer trained on it): the other waits as a draft, so that its swarm's peers and
    the tokenizer's training take nothing from the workers' cores. Returns the organizer's password and the
    volunteers' tokens."""
    engine = make_engine(settings.database_url)
    migrate(engine)
    password = secrets.token_urlsafe(9)
    tokens = []
    with make_sessionmaker(engine).begin() as session:
        organizer = accounts.create_user(session, "organizer", password, is_admin=True)
        albert = experiments.create(
            session,
            organizer,
            experiments.ExperimentCreate(
                slug="demo-albert",
                title="Demo: ALBERT on Python's docstrings",
                description="Two local volunteers pretrain a tiny ALBERT masked language model (DeDLOC's workload) "
                "on the Python standard library's docstrings, with a tokenizer the server trained on them.",
                **DEMO_ALBERT,
                checkpoint_minutes=1.0,
            ),
        )
        if experiment == "demo-albert":
            training_data.attach(
                session,
                settings,
                albert,
                corpus.builtin_text("python-docstrings", max_bytes=DEMO_TEXT_BYTES),
                "builtin:python-docstrings",
                DEMO_CORPUS,
            )
            experiments.change_status(session, albert, "start")
        digits = experiments.create(
            session,
            organizer,
            experiments.ExperimentCreate(
                slug="demo-digits",
                title="Demo: handwritten digits",
                description="A small MLP on scikit-learn's digits: `swarmhub demo --experiment demo-digits`.",
                task="digits",
                task_params={"hidden_size": 64, "batch_size": 64},
                learning_rate=0.003,
                target_batch_size=8192,
                matchmaking_time=2.0,
                averaging_timeout=30.0,
            ),
        )
        if experiment == "demo-digits":
            experiments.change_status(session, digits, "start")
        swav = experiments.create(
            session,
            organizer,
            experiments.ExperimentCreate(
                slug="demo-swav",
                title="Demo: SwAV on drawn shapes",
                description="Two local volunteers pretrain a tiny ResNet with SwAV (DeDLOC's vision workload) on "
                "8 kinds of shape drawn in random colours: `swarmhub demo --experiment demo-swav`. The dashboard "
                "charts the backbone's k-nearest-neighbour accuracy against a random backbone's.",
                **DEMO_SWAV,
                checkpoint_minutes=1.0,
            ),
        )
        if experiment == "demo-swav":
            image_data.attach_source(session, settings, swav, None, "builtin:shapes", image_data.ImageOptions())
            experiments.change_status(session, swav, "start")
        for name in ("volunteer-1", "volunteer-2"):
            user = accounts.create_user(session, name, secrets.token_urlsafe(12))
            tokens.append(accounts.issue_token(session, user, "demo worker")[0])
    engine.dispose()
    return password, tokens


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise click.ClickException("the server exited during start-up: see the lines above")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise click.ClickException(f"the server did not answer on {url} within {timeout:.0f} s")


# The demo's workers share this machine with the hub: each trains on its share of the cores (oversubscribed torch
# threads made one worker train 1.6x faster than the other, and credit holds the faster to the slower's gains),
# at a lower CPU priority than the server and its peers, as volunteers' workers run on their own machines: a witness
# starved by training misses rounds, and a round without it earns no one credit.
DEMO_WORKER_NICE = 10


def _demo_worker_priority() -> None:
    os.nice(DEMO_WORKER_NICE)


WORKER_LEAVE_SECONDS = 75  # a clean leave may wait out an averaging round (the demo's averaging_timeout: 30 s)
SERVER_STOP_SECONDS = 30


def _stop(processes: list[subprocess.Popen[bytes]], timeout: float) -> None:
    """One SIGTERM each, up to ``timeout`` seconds to finish, then SIGKILL for what is left of each one's
    process group: each child runs in a session of its own, and the processes it forked (hivemind's DHT and
    averagers, their p2pd daemons) are in that group, so none outlives a child that had to be killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            click.echo(f"  process {process.pid} did not stop within {timeout:.0f} s: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # the child's group: the child itself and what it forked
        process.wait()


def run_demo(host: str = "127.0.0.1", port: int = 8000, workers: int = 2, experiment: str = DEMO_SLUG) -> None:
    """Server + demo experiments + local workers training ``experiment``, until Ctrl-C; then everything stops."""
    demo_dir = Path.cwd() / ".swarmhub-demo"
    shutil.rmtree(demo_dir, ignore_errors=True)
    (demo_dir / "logs").mkdir(parents=True)
    database_url = f"sqlite:///{demo_dir / 'swarmhub.db'}"
    if experiment == "demo-albert":
        click.echo("Preparing the demo: training a tokenizer on the Python standard library's docstrings…")
    password, tokens = _seed_demo(Settings(data_dir=demo_dir, database_url=database_url), experiment)
    url = f"http://{host}:{port}"
    # the demo serves plain http: a worker refuses it towards another machine (a LAN address) without --insecure
    insecure = [] if transport.on_this_machine(host) else ["--insecure"]
    env = {**os.environ, "SWARMHUB_DATA_DIR": str(demo_dir), "SWARMHUB_DATABASE_URL": database_url}
    exe = [sys.executable, "-m", "swarmhub.worker.cli.main"]
    # Each child runs in a session of its own, so a terminal's Ctrl-C reaches only this process, which then
    # stops each child with exactly one SIGTERM: a second signal would make a worker force its exit instead
    # of leaving the swarm cleanly, and uvicorn skip its graceful shutdown.
    processes: list[subprocess.Popen[bytes]] = []
    for stop_signal in (signal.SIGTERM, signal.SIGHUP):  # also a closed terminal: nothing may outlive the demo
        signal.signal(stop_signal, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C too, even where the demo was started with SIGINT ignored (a script's background job: Python then
    # leaves it ignored, and the demo would outlive the Ctrl-C its screen asks for).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        server = subprocess.Popen(
            [*exe, "server", "--host", host, "--port", str(port), "--log-level", "warning"],
            env=env,
            start_new_session=True,
        )
        processes.append(server)
        _wait_healthy(url, server)
        threads = max(1, (os.cpu_count() or 2) // workers)
        for index, token in enumerate(tokens[:workers]):
            worker_env = {
                **env,
                "SWARMHUB_SERVER": url,
                "SWARMHUB_TOKEN": token,
                "SWARMHUB_CONFIG_DIR": str(demo_dir / f"worker-{index + 1}"),
                "SWARMHUB_STATE_DIR": str(demo_dir / f"worker-{index + 1}"),
            }
            log = open(demo_dir / "logs" / f"worker-{index + 1}.log", "wb")  # noqa: SIM115 - lives as long as the worker
            processes.append(
                subprocess.Popen(
                    [
                        *exe,
                        "join",
                        experiment,
                        "--listen",
                        f"/ip4/{host}/tcp/0",
                        "--cpu-threads",
                        str(threads),
                        *insecure,
                    ],
                    env=worker_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_demo_worker_priority,  # the demo's CLI starts no threads before it
                )
            )
        click.echo("")
        click.echo(f"  Dashboard:  {url}/experiments/{experiment}")
        click.echo(f"  Organizer:  log in at {url}/login as 'organizer' with password {password}")
        click.echo(f"  Workers:    {workers} local volunteers training; logs in {demo_dir / 'logs'}")
        click.echo("  Press Ctrl-C to stop everything.")
        click.echo("")
        while server.poll() is None:
            time.sleep(0.5)
        raise click.ClickException("the server stopped unexpectedly")
    except KeyboardInterrupt:
        click.echo("\nStopping the workers and the server…")
    finally:
        for stop_signal in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # another Ctrl-C must not cut this short
            signal.signal(stop_signal, signal.SIG_IGN)
        _stop(processes[1:], WORKER_LEAVE_SECONDS)
        _stop(processes[:1], SERVER_STOP_SECONDS)
    click.echo("Stopped. Nothing is left running.")
