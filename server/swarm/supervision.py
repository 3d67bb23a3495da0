"""Supervision of the server's peer processes: restarts with exponential backoff and jitter, and their state.

Each running experiment has up to three peer processes (``monitor``: bootstrap and monitor; ``witness``: the
auxiliary peer whose rounds are the ledger's only evidence; ``checkpoints``: the checkpoint peer). A process that
exits is started again by the next reconcile, but not before its backoff has passed: 2 s after the first failure,
doubling up to 5 minutes, each delay drawn in [0.5, 1.5] of that (so that the peers of fifty experiments that failed
together do not all come back in the same second). A process that ran ``STABLE_SECONDS`` before it exited starts
the count again.

What a process last failed with (its ``failed`` event, else how it exited) is logged once per distinct error, not
once per restart, and its state (``PeerState``) is what the organizer's swarm view, ``GET /api/experiments/SLUG/swarm``,
``/healthz?detail=1`` and the ``swarmhub_server_peer_up`` gauge show.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

logger = logging.getLogger("swarmhub.swarm")

KINDS = ("monitor", "witness", "checkpoints")
PeerKind = Literal["monitor", "witness", "checkpoints"]
FIRST_DELAY = 2.0
MAX_DELAY = 300.0
STABLE_SECONDS = 120.0  # a process that ran this long before it exited is not failing: its backoff starts again
ERROR_CHARS = 500


class PeerState(BaseModel):
    """One of the server's peer processes for an experiment, as its host sees it now."""

    kind: PeerKind = Field(
        description="monitor (bootstrap and monitor peer), witness (the auxiliary peer whose witnessed rounds are "
        "the only source of verified credit) or checkpoints (the checkpoint peer)"
    )
    state: Literal["running", "restarting"] = Field(
        description="running: its process is alive; restarting: it exited and is started again at next_attempt_at"
    )
    index: int = Field(
        default=0,
        description="Which of the experiment's witnesses it is (one per averaging group: 0, 1, ...); 0 for the "
        "other kinds",
    )
    in_swarm: bool = Field(description="Whether it has joined the swarm since it last started")
    peer_id: str | None = Field(default=None, description="Its peer ID in the swarm, once it has joined")
    since: datetime = Field(description="When it entered this state (started, or exited)")
    restarts: int = Field(description="How many times it was started again since the experiment's swarm started here")
    last_error: str | None = Field(description="What it last failed with (its own message, or how it exited)")
    last_error_at: datetime | None = None
    next_attempt_at: datetime | None = Field(default=None, description="When it is started again (restarting only)")


@dataclass
class Supervision:
    """The restart record of one peer process (one experiment, one kind, one index)."""

    kind: PeerKind
    index: int = 0
    running: bool = False
    in_swarm: bool = False  # it said ``ready`` since its last start
    peer_id: str | None = None  # what it said it is in the swarm (kept across restarts: its identity file is)
    since: float = field(default_factory=time.time)  # wall clock: shown to people
    started_monotonic: float = 0.0
    starts: int = 0
    failures: int = 0  # in a row: the backoff's exponent
    next_start: float = 0.0  # monotonic: not started again before this
    last_error: str | None = None
    last_error_at: float | None = None
    pending_error: str | None = None  # the process's own ``failed`` message, taken when it exits
    logged: set[str] = field(default_factory=set)
    rng: random.Random = field(default_factory=random.Random)

    def may_start(self, now: float | None = None) -> bool:
        return not self.running and (now if now is not None else time.monotonic()) >= self.next_start

    def started(self) -> None:
        self.running, self.in_swarm = True, False
        self.starts += 1
        self.since = time.time()
        self.started_monotonic = time.monotonic()

    def failed_with(self, message: str) -> None:
        """The process said why it is about to exit (its ``failed`` event)."""
        self.pending_error = " ".join(message.split())[:ERROR_CHARS]

    def exited(self, returncode: int | None, run_id: str) -> float:
        """Record an exit; returns the delay before the next start."""
        now = time.monotonic()
        ran = now - self.started_monotonic
        self.running, self.in_swarm = False, False
        self.since = time.time()
        error = self.pending_error or _describe_exit(returncode)
        self.pending_error = None
        self.last_error, self.last_error_at = error, time.time()
        self.failures = 1 if ran >= STABLE_SECONDS else self.failures + 1
        delay = min(MAX_DELAY, FIRST_DELAY * 2 ** (self.failures - 1)) * self.rng.uniform(0.5, 1.5)
        self.next_start = now + delay
        if error not in self.logged:  # once per distinct error, not once per restart
            self.logged.add(error)
            logger.error("the %s peer of %s exited: %s (restarting with backoff)", self.name, run_id, error)
        else:
            logger.debug("the %s peer of %s exited again: %s; next start in %.1f s", self.name, run_id, error, delay)
        return delay

    @property
    def name(self) -> str:
        return f"{self.kind} {self.index}" if self.index else self.kind

    def state(self) -> PeerState:
        def stamp(value: float | None) -> datetime | None:
            return datetime.fromtimestamp(value, UTC) if value is not None else None

        next_attempt = None
        if not self.running:
            next_attempt = stamp(time.time() + max(0.0, self.next_start - time.monotonic()))
        return PeerState(
            kind=self.kind,
            index=self.index,
            state="running" if self.running else "restarting",
            in_swarm=self.in_swarm,
            peer_id=self.peer_id,
            since=datetime.fromtimestamp(self.since, UTC),
            restarts=max(0, self.starts - 1),
            last_error=self.last_error,
            last_error_at=stamp(self.last_error_at),
            next_attempt_at=next_attempt,
        )


class Supervisor:
    """The restart records of one host's peer processes, by (run_id, kind, index). ``lock`` is the host's: an exit is
    recorded under it, so that a reconcile never sees a process gone and its backoff not yet started."""

    def __init__(self, lock: threading.Lock):
        self._lock = lock
        self._records: dict[tuple[str, PeerKind, int], Supervision] = {}

    def record(self, run_id: str, kind: PeerKind, index: int = 0) -> Supervision:
        found = self._records.get((run_id, kind, index))
        if found is None:
            found = self._records[(run_id, kind, index)] = Supervision(kind, index)
        return found

    def may_start(self, run_id: str, kind: PeerKind, index: int = 0) -> bool:
        """Whether a peer process that is not running may be started now (call with the lock held): not before the
        backoff of its last exit has passed."""
        return self.record(run_id, kind, index).may_start()

    def forget(self, run_id: str, kind: PeerKind, index: int = 0) -> None:
        """The host stopped the process on purpose (call with the lock held)."""
        self._records.pop((run_id, kind, index), None)

    def watch(
        self,
        run_id: str,
        kind: PeerKind,
        process: subprocess.Popen[Any],
        current: Callable[[], subprocess.Popen[Any] | None],
        reader: threading.Thread | None = None,
        index: int = 0,
    ) -> None:
        """Record ``process``'s start and, in a thread, its exit: unless the host stopped it on purpose (it is no
        longer ``current()``), the exit starts its backoff. What it forked (hivemind's DHT and averagers, p2pd) is
        in its process group: a peer that died is not left with orphans holding its port and its pipes."""
        record = self.record(run_id, kind, index)
        record.started()

        def wait() -> None:
            code = process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            if reader is not None:
                reader.join(timeout=2)  # its last words (a ``failed`` event) first
            with self._lock:
                if current() is process:
                    record.exited(code, run_id)

        threading.Thread(target=wait, daemon=True, name=f"wait-{kind}{index or ''}-{run_id}").start()

    def states(self, run_id: str) -> list[PeerState]:
        """The state of each peer process the host runs (or restarts) for ``run_id``."""
        with self._lock:
            return [self._records[key].state() for key in sorted(self._records) if key[0] == run_id]

    def all_states(self) -> dict[str, list[PeerState]]:
        """run_id -> :meth:`states`, for every experiment the host runs peers for."""
        return {run_id: self.states(run_id) for run_id in sorted({key[0] for key in list(self._records)})}


# How long a peer has to leave the swarm on SIGTERM before its process group is killed: the checkpoint peer may be
# writing a checkpoint; a witness may be in a round
KEEPER_STOP_SECONDS = 60.0
AUX_STOP_SECONDS = 30.0
MONITOR_STOP_SECONDS = 15.0


def terminate_all(processes: list[tuple[subprocess.Popen[Any], float, str]]) -> None:
    """Stop each ``(process, timeout, what)`` peer at once: every one gets SIGTERM first (it leaves the swarm
    cleanly), then each has its own timeout, counted from that moment, to exit before SIGKILL goes to its group. One
    after another, a busy server once took over a minute to stop an ALBERT run's three peers."""
    started = time.monotonic()
    for process, _, _ in processes:
        if process.poll() is None:
            process.terminate()  # the peer shuts its DHT down cleanly on SIGTERM
    for process, timeout, what in processes:
        try:
            process.wait(max(started + timeout - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            logger.warning("swarm peer %s did not stop in %.0f s: killing its process group", process.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        if process.stdin is not None:
            process.stdin.close()
        logger.info("stopped %s", what)
    # stdout is left to the reader thread, which sees EOF now that the peer is gone (closing it here
    # would block on the lock that thread holds while reading).


def _describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exited"
    if returncode < 0:
        return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"
