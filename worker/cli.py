"""The ``swarmhub`` command line: log in, list experiments, join one and train with its swarm.

Every failure is one line, ``Error: <what happened>: <what to do next>``, and a documented exit code
(see :mod:`swarmhub.worker.client`); never a traceback. ``server``, ``admin`` and ``demo`` are thin
wrappers around ``swarmhub.server.cli`` (the ``[server]`` extra), imported only when used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, NoReturn

import click
from pydantic import SecretStr, ValidationError

from .. import __version__
from .client import (
    ApiClient,
    ExitCode,
    WorkerError,
    check_clock,
    not_accepting,
    not_logged_in,
    removed,
)
from .credentials import (
    StoredCredentials,
    delete_credentials,
    load_credentials,
    resolve_credentials,
    store_credentials,
)
from .protocol import SLUG_RE, JoinRequest, JoinResponse, SwarmToken
from .settings import WorkerSettings
from .spool import Spool, discard, leftovers
from .transport import insecure_option, require_encryption

if TYPE_CHECKING:
    from .reporter import Reporter
    from .training import Progress, TrainingSummary

logger = logging.getLogger("swarmhub.worker")

DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/0"
SERVER_EXTRA_HINT = "The server needs the server extra: pip install 'swarmhub[server]'"
PLAIN_PROGRESS_EVERY = 5.0  # seconds between progress lines when stdout is not a terminal
USER_AGENT = f"swarmhub-worker/{__version__}"


class _Cli(click.Group):
    """Renders :class:`WorkerError` and Ctrl-C as one line and an exit code, for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except WorkerError as exc:
            _fail(exc.message, exc.exit_code)
        except KeyboardInterrupt:
            click.echo("\nInterrupted.", err=True)
            raise click.exceptions.Exit(ExitCode.INTERRUPTED) from None
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # a bug: still one line, no traceback on the volunteer's console
            logger.debug("unexpected error", exc_info=True)
            _fail(f"unexpected {type(exc).__name__}: {exc} (please report this bug)", ExitCode.ERROR)


def _fail(message: str, code: int) -> NoReturn:
    click.echo(f"Error: {message}", err=True)
    raise click.exceptions.Exit(code)


def _settings() -> WorkerSettings:
    try:
        return WorkerSettings()
    except ValidationError as exc:
        fields = ", ".join("SWARMHUB_" + str(err["loc"][0]).upper() for err in exc.errors() if err["loc"])
        raise WorkerError(f"Invalid setting in the environment: check {fields}", ExitCode.USAGE) from None


def _authed_client(settings: WorkerSettings, insecure: bool) -> tuple[ApiClient, str]:
    """A client with the resolved token; exits 3 with the login hint when there is none."""
    creds = resolve_credentials(settings)
    if creds.token is None:
        raise not_logged_in(creds.server)
    if creds.server is None:
        raise WorkerError(
            "No server configured: run `swarmhub login --server URL` or set SWARMHUB_SERVER", ExitCode.AUTH
        )
    token = creds.token.get_secret_value()
    return ApiClient(require_encryption(creds.server, insecure), token, user_agent=USER_AGENT), token


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="swarmhub")
def main() -> None:
    """Train deep-learning models together on donated hardware.

    \b
    Volunteers:  swarmhub login --server URL;  swarmhub experiments;  swarmhub join SLUG
    Exit codes:  0 ok, 1 unexpected error, 2 usage, 3 authentication, 4 unknown experiment,
                 5 server unreachable, 6 experiment not accepting volunteers, 7 clock off, 8 removed,
                 130 Ctrl-C, 143 SIGTERM
    """


# -- account ----------------------------------------------------------------------------------------------


@main.command()
@click.option("--server", "server_opt", metavar="URL", help="Server URL (default: SWARMHUB_SERVER or the last one)")
@click.option("--with-token", is_flag=True, help="Read an API token from stdin instead of the browser flow")
@insecure_option
def login(server_opt: str | None, with_token: bool, insecure: bool) -> None:
    """Log in to a swarmhub server (device-code flow in the browser, or --with-token)."""
    settings = _settings()
    stored = load_credentials(settings.config_dir)
    server = server_opt or settings.server or (stored.server if stored else None)
    if not server:
        raise WorkerError("No server given: run `swarmhub login --server URL`", ExitCode.USAGE)
    server = require_encryption(server, insecure)
    with ApiClient(server, user_agent=USER_AGENT) as client:
        if with_token:
            line = sys.stdin.readline().strip()
            if not line:
                raise WorkerError(
                    "No token on stdin: pipe one in, e.g. `swarmhub login --with-token < token.txt`",
                    ExitCode.USAGE,
                )
            username = client.me(token=line).username
            token = line
        else:
            token, username = _device_flow(client)
    path = store_credentials(
        settings.config_dir, StoredCredentials(server=server, token=SecretStr(token), username=username)
    )
    click.echo(f"Logged in to {server} as {username} (credentials in {path})")
    if settings.token is not None:
        click.echo("Note: SWARMHUB_TOKEN is set and overrides the stored token.", err=True)


def _device_flow(client: ApiClient) -> tuple[str, str]:
    """RFC 8628: show the code, poll until the user approves it in the browser."""
    code = client.device_code(f"swarmhub-cli on {socket.gethostname()}")
    click.echo(f"Open this page in a browser and approve the login:\n\n    {code.verification_uri_complete}\n")
    click.echo(f"(or go to {code.verification_uri} and enter the code {code.user_code})")
    click.echo("Waiting for approval... (Ctrl-C to cancel)")
    interval = max(code.interval, 1)
    deadline = time.monotonic() + code.expires_in
    while time.monotonic() < deadline:
        time.sleep(interval)
        answer = client.device_token(code.device_code)
        if isinstance(answer, str):
            if answer == "authorization_pending":
                continue
            if answer == "slow_down":
                interval += 5
                continue
            if answer == "access_denied":
                raise WorkerError(
                    "The login was denied in the browser: run `swarmhub login` to try again", ExitCode.AUTH
                )
            if answer == "expired_token":
                break
            raise WorkerError(f"Login failed ({answer}): run `swarmhub login` to try again", ExitCode.AUTH)
        return answer.access_token, answer.username
    raise WorkerError("The login code expired before it was approved: run `swarmhub login` again", ExitCode.AUTH)


@main.command()
@insecure_option
def logout(insecure: bool) -> None:
    """Revoke the stored token on the server (best effort) and delete it from this machine."""
    settings = _settings()
    stored = load_credentials(settings.config_dir)
    if stored is None:
        click.echo("Not logged in: nothing to remove.")
    else:
        revoked = ""
        try:
            server = require_encryption(stored.server, insecure)
            with ApiClient(server, stored.token.get_secret_value(), user_agent=USER_AGENT) as client:
                client.revoke_token()
            revoked = "token revoked on the server, "
        except WorkerError as exc:
            click.echo(f"Warning: could not revoke the token on the server ({exc.message})", err=True)
        delete_credentials(settings.config_dir)
        click.echo(f"Logged out of {stored.server}: {revoked}credentials removed from this machine.")
    if settings.token is not None:
        click.echo("Note: SWARMHUB_TOKEN is still set in your environment.", err=True)


@main.command()
@insecure_option
def whoami(insecure: bool) -> None:
    """Show who you are logged in as, and where."""
    settings = _settings()
    client, _ = _authed_client(settings, insecure)
    with client:
        me = client.me()
    role = " (admin)" if me.is_admin else ""
    source = " [token from SWARMHUB_TOKEN]" if resolve_credentials(settings).source == "env" else ""
    click.echo(f"{me.username}{role} on {client.server_url}{source}")


@main.command()
@insecure_option
def experiments(insecure: bool) -> None:
    """List the server's experiments."""
    settings = _settings()
    creds = resolve_credentials(settings)
    if not creds.server:
        raise WorkerError(
            "No server configured: run `swarmhub login --server URL` or set SWARMHUB_SERVER", ExitCode.USAGE
        )
    token = creds.token.get_secret_value() if creds.token else None
    with ApiClient(require_encryption(creds.server, insecure), token, user_agent=USER_AGENT) as client:
        items = client.experiments()
    if not items:
        click.echo(f"No experiments on {client.server_url} yet.")
        return
    rows = [("SLUG", "STATUS", "TASK", "TITLE")] + [(e.slug, e.status.value, e.task, e.title) for e in items]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for row in rows:
        padded = [cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)]
        click.echo("  ".join([*padded, row[3]]))


# -- join ---------------------------------------------------------------------------------------------------


@main.command()
@click.argument("slug")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--max-steps", type=click.IntRange(min=1), help="Stop after this many local steps")
@click.option("--max-minutes", type=click.FloatRange(min=0, min_open=True), help="Stop after this long")
@click.option(
    "--listen",
    "listen",
    multiple=True,
    default=(DEFAULT_LISTEN,),
    show_default=True,
    metavar="MADDR",
    help="hivemind listen multiaddr (repeatable)",
)
@click.option(
    "--client-mode",
    is_flag=True,
    help="Do not accept connections from other peers (default: only when the server cannot dial this machine)",
)
@click.option(
    "--aux",
    "auxiliary",
    is_flag=True,
    help="Help the swarm average without computing gradients (a CPU machine with a good link)",
)
@click.option(
    "--precision",
    type=click.Choice(["auto", "fp32", "bf16", "fp16"]),
    default="auto",
    show_default=True,
    help="Compute precision: auto is bf16 or fp16 on CUDA, fp32 on the CPU; the swarm always averages fp32",
)
@click.option("--verbose", is_flag=True, help="Show hivemind's logs on the console instead of the log file")
@insecure_option
def join(
    slug: str,
    device: str,
    max_steps: int | None,
    max_minutes: float | None,
    listen: Sequence[str],
    client_mode: bool,
    auxiliary: bool,
    precision: str,
    verbose: bool,
    insecure: bool,
) -> None:
    """Join experiment SLUG and train with its swarm until stopped (Ctrl-C leaves cleanly)."""
    settings = _settings()
    client, token = _authed_client(settings, insecure)
    if not SLUG_RE.match(slug):
        raise WorkerError(
            f"{slug!r} is not an experiment name: run `swarmhub experiments` to list them", ExitCode.USAGE
        )
    from . import doctor, swarm_access
    from .reporter import Reporter
    from .training import resolve_device, resolve_precision

    torch_device = resolve_device(device)
    resolve_precision(precision, torch_device)  # a precision this device lacks is a usage error, before joining
    with client:
        username = client.me().username
        # One key per user and experiment on this machine: the peer ID, the swarm token and the signed
        # progress records all use it, so the peer ID is stable across restarts and its work attributable.
        identity_path = settings.identity_path(client.server_url, username, slug)
        public_key = swarm_access.public_key_text(swarm_access.load_or_create_identity(identity_path))
        request = JoinRequest(device=torch_device.type, client_version=__version__, peer_public_key=public_key)
        sent_at = time.time()
        joined = client.join(slug, request)
        check_clock(joined.server_time, sent_at, time.time())
        doctor.raise_open_files_limit()
        if auxiliary and client_mode:
            raise WorkerError("An auxiliary peer must accept connections: drop --client-mode", ExitCode.USAGE)
        if not client_mode:
            # Can other peers dial us? If not, join in client mode: train and average through reachable peers.
            reach, listen = doctor.check_reachability(client, listen)
            client_mode = reach.status != doctor.OK
            if client_mode and auxiliary:
                raise WorkerError(
                    f"An auxiliary peer must be reachable, and {reach.detail.split(':')[0]}: {reach.fix}",
                    ExitCode.USAGE,
                )
            if client_mode:
                click.echo(f"Note: {reach.detail}.")
        # The link speed goes to hivemind's load balancing: faster peers reduce a larger part of the vector.
        bandwidth = None if client_mode else doctor.measure_bandwidth(client)

    def fetch_token() -> SwarmToken:
        with ApiClient(client.server_url, token, user_agent=USER_AGENT) as refresher:
            return refresher.swarm_token(joined, public_key)

    def denied() -> set[str]:
        with ApiClient(client.server_url, token, user_agent=USER_AGENT) as poller:
            return poller.denylist(slug)

    corpus = None
    if joined.data_path and not auxiliary:
        corpus = remote_corpus(client.server_url, token, joined, settings.corpus_dir(client.server_url, slug))

    click.echo(
        f"Joined {slug!r} ({joined.experiment.title}) as {joined.username}: "
        + ("helping average (auxiliary peer)" if auxiliary else f"training {joined.experiment.task} on {torch_device}")
        + ". Ctrl-C to leave."
    )
    spool_dir = settings.spool_dir(client.server_url, joined.username, slug)
    _send_leftovers(client.server_url, token, joined, spool_dir)
    reporter = Reporter.for_join(client.server_url, token, joined, spool=Spool(spool_dir, joined.worker_id)).start()
    code = run_session(
        joined,
        device=str(torch_device),
        listen_maddrs=listen,
        client_mode=client_mode,
        auxiliary=auxiliary,
        bandwidth=bandwidth,
        precision=precision,
        max_steps=max_steps,
        max_minutes=max_minutes,
        reporter=reporter,
        log_path=settings.logs_dir / f"{slug}.log",
        verbose=verbose,
        restore_stderr=False,  # the process exits next
        identity_path=identity_path,
        fetch_token=fetch_token,
        denied=denied,
        corpus=corpus,
    )
    raise click.exceptions.Exit(code)


def remote_corpus(server_url: str, token: str, joined: JoinResponse, cache_dir: Path) -> Any:
    """The experiment's corpus, downloaded as the task reads it and cached in ``cache_dir``."""
    assert joined.data_path is not None
    return corpus_of(server_url, token, joined.experiment.slug, cache_dir, joined.data_path)


def corpus_of(server_url: str, token: str, slug: str, cache_dir: Path, data_path: str | None = None) -> Any:
    from .data import RemoteCorpus

    path = data_path or f"/api/experiments/{slug}/data"  # slug: checked against SLUG_RE by the commands
    with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
        manifest = api.data_manifest(slug, path)

    def get(name: str) -> bytes:
        with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
            return api.data_file(slug, path, name)

    def next_shard() -> int | None:
        try:
            with ApiClient(server_url, token, user_agent=USER_AGENT) as api:
                return api.next_shard(slug, path)
        except WorkerError as exc:  # training goes on with shards in this worker's own order
            logger.warning("could not ask the server for the next shard: %s", exc.message)
            return None

    return RemoteCorpus(manifest, cache_dir, get, next_shard)


@main.command()
@click.argument("slug", required=False)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option(
    "--listen",
    "listen",
    multiple=True,
    default=(DEFAULT_LISTEN,),
    show_default=True,
    metavar="MADDR",
    help="the multiaddr `join` would listen on (repeatable)",
)
@insecure_option
def doctor(slug: str | None, device: str, listen: Sequence[str], insecure: bool) -> None:
    """Check this machine before it joins: device, clock, open files, bandwidth, reachability, and with
    SLUG the experiment's training throughput here. Exits 1 when something must be fixed first."""
    from . import doctor as checks
    from .training import resolve_device

    settings = _settings()
    client, token = _authed_client(settings, insecure)
    torch_device = resolve_device(device)
    with client:
        experiment = None
        if slug is not None:
            if not SLUG_RE.match(slug):
                raise WorkerError(
                    f"{slug!r} is not an experiment name: run `swarmhub experiments` to list them", ExitCode.USAGE
                )
            experiment = client.experiment(slug)
        click.echo(f"Checking this machine for {client.server_url}" + (f" and {slug!r}" if slug else "") + ":")

        def text() -> Any:  # the experiment's corpus, for a task that trains on one: downloaded as `join` does
            assert slug is not None and token is not None
            return corpus_of(client.server_url, token, slug, settings.corpus_dir(client.server_url, slug))

        findings = []
        for check in (
            lambda: checks.check_device(torch_device),
            checks.check_open_files,
            lambda: checks.check_clock(client),
            lambda: checks.check_bandwidth(client),
            lambda: checks.check_reachability(client, listen)[0],
            *(
                [lambda: checks.check_throughput(experiment, torch_device, corpus=text)]
                if experiment is not None
                else []
            ),
        ):
            finding = check()
            findings.append(finding)
            click.echo(finding.line())
    worst = checks.worst(findings)
    click.echo("Ready to join." if worst != checks.FAIL else "Fix what failed above, then run `swarmhub doctor` again.")
    raise click.exceptions.Exit(0 if worst != checks.FAIL else ExitCode.ERROR)


def _send_leftovers(server_url: str, token: str, joined: JoinResponse, folder: Path) -> None:
    """Reports an earlier session spooled and never got acknowledged (it crashed, or the server was away):
    sent now, to the worker runs they belong to. The server stores each exactly once."""
    from .reporter import Reporter

    for worker_id in leftovers(folder):
        spool = Spool(folder, worker_id)
        count = len(spool.unacked())
        if not count:
            spool.close(done=True)
            continue
        earlier = joined.model_copy(update={"worker_id": worker_id})
        reporter = Reporter.for_join(server_url, token, earlier, spool=spool).start()
        if reporter.close(timeout=15.0):
            click.echo(f"Sent {count} metric reports left from an earlier session.")
        elif reporter.fatal is not None and reporter.fatal.exit_code in (ExitCode.AUTH, ExitCode.NOT_FOUND):
            logger.warning("dropping %d spooled reports the server refuses: %s", count, reporter.fatal.message)
            discard(folder, worker_id)
        else:
            logger.warning("%d reports of worker run %s are still unsent: kept for next time", count, worker_id)


def run_session(
    joined: JoinResponse,
    *,
    device: str = "auto",
    listen_maddrs: Sequence[str] = (DEFAULT_LISTEN,),
    client_mode: bool = False,
    auxiliary: bool = False,
    bandwidth: float | None = None,
    precision: str = "auto",
    max_steps: int | None = None,
    max_minutes: float | None = None,
    reporter: Reporter | None = None,
    log_path: Path,
    verbose: bool = False,
    out: IO[str] | None = None,
    restore_stderr: bool = True,
    identity_path: Path,
    fetch_token: Callable[[], SwarmToken] | None = None,
    denied: Callable[[], set[str]] | None = None,
    corpus: Any = None,
) -> int:
    """Train with the swarm as ``swarmhub join`` does, and return the exit code.

    Owns the process for the duration: hivemind's logs and the stderr of its child processes go to
    ``log_path`` (unless ``verbose``), SIGINT/SIGTERM stop training cleanly (a second Ctrl-C forces), one
    progress line goes to ``out`` (stdout), and ``reporter`` (if any) is flushed and closed before returning.
    A command that exits right after passes ``restore_stderr=False``: fd 2 then stays on the log file, which
    keeps hivemind's noise at interpreter exit out of the console.
    """
    from .training import StopReason, train

    out = out or sys.stdout
    stop = threading.Event()
    summary: TrainingSummary | None = None
    error: WorkerError | None = None
    with _swarm_logging(log_path, verbose, restore_stderr) as console:
        line = _ProgressLine(out)
        with _stop_on_signals(stop, console) as received:
            try:
                where = "" if verbose else f" (hivemind's log: {log_path})"
                console.write(f"Connecting to the swarm...{where}\n")
                summary = train(
                    joined,
                    device=device,
                    listen_maddrs=listen_maddrs,
                    client_mode=client_mode,
                    auxiliary=auxiliary,
                    bandwidth=bandwidth,
                    precision=precision,
                    max_steps=max_steps,
                    max_minutes=max_minutes,
                    reporter=reporter,
                    on_progress=line.update,
                    stop_event=stop,
                    identity_path=identity_path,
                    fetch_token=fetch_token,
                    denied=denied,
                    corpus=corpus,
                )
            except WorkerError as exc:
                error = exc
            except KeyboardInterrupt:  # forced by a second Ctrl-C (train has shut hivemind down)
                pass
            except Exception as exc:
                logger.exception("training failed")
                error = WorkerError(f"training failed ({type(exc).__name__}: {exc})", ExitCode.ERROR)
            finally:
                line.finish()
                if reporter is not None:
                    reporter.close(timeout=5.0)
        first_signal = received[0] if received else None

        if summary is not None:
            loss = f", loss {summary.last_loss:.4f}" if summary.last_loss is not None else ""
            console.write(
                f"Done: {summary.steps:,} steps, {summary.samples:,} samples contributed, "
                f"swarm epoch {summary.epoch}{loss}.\n"
            )
            if summary.stop_reason == StopReason.control and summary.control is not None:
                logger.info("stopped by the server: %s", summary.control.message)
                if summary.control.removed:
                    error = removed(joined.experiment.slug)
                else:
                    error = not_accepting(joined.experiment.slug, summary.control.status.value)
            elif summary.stop_reason == StopReason.fatal and summary.fatal is not None:
                error = summary.fatal
        if error is not None and first_signal is None:
            where = "" if verbose else f" (log: {log_path})"
            console.write(f"Error: {error.message}{where}\n")
            return error.exit_code
        if first_signal == signal.SIGINT:
            console.write("Left the swarm (Ctrl-C).\n")
            return ExitCode.INTERRUPTED
        if first_signal is not None:
            console.write("Left the swarm (SIGTERM).\n")
            return ExitCode.TERMINATED
        return ExitCode.OK


class _ProgressLine:
    """One live line: '\\r'-updated on a terminal, otherwise a plain line at most every few seconds."""

    def __init__(self, stream: IO[str]):
        self.stream = stream
        self.tty = stream.isatty()
        self._last_plain = -PLAIN_PROGRESS_EVERY
        self._dirty = False

    def update(self, p: Progress) -> None:
        averaged = f" (averaged with {p.averaged_peers})" if p.averaged_peers else ""
        text = (
            f"epoch {p.epoch} | {p.peers} peers{averaged} | {p.samples:,} samples | loss {p.loss:.4f} | "
            f"{p.samples_per_second:,.0f} samples/s"
        )
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K")
            self._dirty = True
        elif time.monotonic() - self._last_plain >= PLAIN_PROGRESS_EVERY:
            self._last_plain = time.monotonic()
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._dirty:
            self.stream.write("\n")
            self.stream.flush()
            self._dirty = False


@contextlib.contextmanager
def _swarm_logging(log_path: Path, verbose: bool, restore: bool) -> Iterator[IO[str]]:
    """Route hivemind's logs and fd 2 (inherited by its child processes) to ``log_path``.

    Yields the console for our own messages: a duplicate of the original stderr. With ``restore=False``
    fd 2 stays on the log file afterwards: hivemind's leftovers still print noise ("Task was destroyed but
    it is pending!") when the interpreter exits.
    """
    from hivemind.utils.logging import use_hivemind_log_handler

    use_hivemind_log_handler("in_root_logger")
    if verbose:
        yield sys.stderr
        return
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    console = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8", errors="replace")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.write(
        log_fd,
        f"\n=== swarmhub {__version__} session {datetime.now(timezone.utc).isoformat()} ===\n".encode(),
    )
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        yield console
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        if restore:
            os.dup2(saved, 2)
        os.close(saved)
        console.close()


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event, console: IO[str]) -> Iterator[list[int]]:
    """SIGINT/SIGTERM set ``stop`` (training leaves the swarm cleanly); a second one raises KeyboardInterrupt.

    Yields the list of signals received, first one first (it decides the exit code).
    """
    received: list[int] = []
    owner = os.getpid()
    try:
        console_fd = console.fileno()
    except (OSError, ValueError):
        console_fd = None

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            # A process hivemind forked (DHT, averagers) inherited this handler: there the signal must do
            # what hivemind expects (its shutdown terminates a slow child with SIGTERM).
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        first = not received
        received.append(signum)
        # os.write, not console.write: a signal handler may interrupt a write to the same buffered file
        if first:
            stop.set()
            note = "\nStopping: leaving the swarm cleanly (press Ctrl-C again to force)...\n"
        else:
            note = "\nForcing the stop.\n"
        if console_fd is not None:
            with contextlib.suppress(OSError):
                os.write(console_fd, note.encode())
        if not first:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# -- server-side commands (the [server] extra) --------------------------------------------------------------


def _server_cli() -> Any:
    try:
        from ..server import cli as server_cli
    except ImportError as exc:
        # A module of ours that fails to import is a bug; a missing server package or web stack is the extra.
        if exc.name and exc.name.startswith("swarmhub") and exc.name not in ("swarmhub.server", "swarmhub.server.cli"):
            raise
        click.echo(SERVER_EXTRA_HINT, err=True)
        raise click.exceptions.Exit(ExitCode.ERROR) from None
    return server_cli


def _exit_with(result: Any) -> None:
    if isinstance(result, int) and result != 0:
        raise click.exceptions.Exit(result)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option("--database-url", default=None, help="SQLAlchemy URL (default: SWARMHUB_DATABASE_URL or SQLite)")
@click.option(
    "--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"])
)
def server(host: str, port: int, database_url: str | None, log_level: str) -> None:
    """Run the swarmhub server (needs the [server] extra)."""
    _exit_with(_server_cli().run_server(host, port, database_url, log_level))


@main.command()
@click.argument("username")
@click.option("--password-stdin", is_flag=True, help="Read the password from stdin")
def admin(username: str, password_stdin: bool) -> None:
    """Create or promote an admin account on the server's database (needs the [server] extra)."""
    _exit_with(_server_cli().run_admin(username, password_stdin))


@main.command()
@click.option(
    "--experiment",
    type=click.Choice(["demo-albert", "demo-digits"]),
    default="demo-albert",
    show_default=True,
    help="Which demo experiment the two local workers train",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the server and the workers listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535), help="The server's port")
def demo(experiment: str, host: str, port: int) -> None:
    """Start a server, two demo experiments and two local workers (needs the [server] extra)."""
    _exit_with(_server_cli().run_demo(host=host, port=port, experiment=experiment))


if __name__ == "__main__":  # `python -m swarmhub.worker.cli`, as `swarmhub demo` runs its workers
    main(prog_name="swarmhub")
