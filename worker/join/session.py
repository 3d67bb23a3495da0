"""The session runner: trains with the swarm in this process, as ``swarmhub join`` does, and returns the exit code.

While it runs it owns the process: hivemind's logs and fd 2 go to a log file, SIGINT/SIGTERM leave the swarm cleanly
(a second Ctrl-C forces), and one live progress line goes to the console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

from swarmhub import __version__
from swarmhub.common.protocol import JoinResponse, SwarmToken
from swarmhub.worker.client import ExitCode, WorkerError, not_accepting, removed

if TYPE_CHECKING:
    from swarmhub.worker.join.reporter import Reporter
    from swarmhub.worker.training.loop import Progress, TrainingSummary

logger = logging.getLogger("swarmhub.worker")

DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/0"
PLAIN_PROGRESS_EVERY = 5.0  # seconds between progress lines when stdout is not a terminal


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
    progress_file: Path | None = None,
) -> int:
    """Train with the swarm as ``swarmhub join`` does, and return the exit code.

    Owns the process for the duration: hivemind's logs and the stderr of its child processes go to
    ``log_path`` (unless ``verbose``), SIGINT/SIGTERM stop training cleanly (a second Ctrl-C forces), one
    progress line goes to ``out`` (stdout), and ``reporter`` (if any) is flushed and closed before returning.
    A command that exits right after passes ``restore_stderr=False``: fd 2 then stays on the log file, which
    keeps hivemind's noise at interpreter exit out of the console. With ``progress_file``, every progress
    snapshot is also written there (for ``swarmhub service status``).
    """
    from swarmhub.worker.training.loop import StopReason
    from swarmhub.worker.training.peer import train

    out = out or sys.stdout
    stop = threading.Event()
    summary: TrainingSummary | None = None
    error: WorkerError | None = None
    with _swarm_logging(log_path, verbose, restore_stderr) as console:
        line = _ProgressLine(out)
        on_progress = line.update if progress_file is None else _recording(line.update, progress_file, joined, reporter)
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
                    on_progress=on_progress,
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


def _recording(
    show: Callable[[Progress], None], path: Path, joined: JoinResponse, reporter: Reporter | None
) -> Callable[[Progress], None]:
    """``show`` each snapshot, and write it to ``path`` with the reporter's acknowledgements."""
    from swarmhub.worker.service.state import JoinProgress, write_json_atomically

    def update(p: Progress) -> None:
        show(p)
        acked = reporter.last_ack_at if reporter is not None else None
        record = JoinProgress(
            experiment=joined.experiment.slug,
            step=p.step,
            samples=p.samples,
            samples_per_second=p.samples_per_second,
            loss=p.loss,
            peers=p.peers,
            unacked_reports=reporter.pending if reporter is not None else None,
            last_ack_at=datetime.fromtimestamp(acked, timezone.utc) if acked is not None else None,
            updated_at=datetime.now(timezone.utc),
        )
        try:
            write_json_atomically(path, record.model_dump_json())
        except OSError as exc:  # the status file is a courtesy: training goes on without it
            logger.debug("could not write %s: %s", path, exc)

    return update


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
    # httpx logs every request at INFO: the deny list read every few seconds filled the volunteer's log
    logging.getLogger("httpx").setLevel(logging.WARNING)
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
