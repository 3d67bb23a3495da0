"""``swarmhub run-service``: the background worker. It supervises one ``swarmhub join`` child process at a time
(``swarmhub join --any`` runs the same loop in the foreground, without limits).

Each tick (:meth:`Runner.tick`) decides from the volunteer's limits whether training may run now:

- outside the hours, on battery, or while other programs keep the CPU busy, it *pauses*: SIGINT to the child,
  which leaves the swarm cleanly as after Ctrl-C (summary printed, unsent metrics kept in the spool for the next
  join), and it starts the child again once the condition has cleared for ``settle`` seconds;
- which experiment runs is a :mod:`.choice`: the list in order, shares of the running time, or the one that needs
  peers most. An experiment that stops accepting volunteers, is unknown, or removed this volunteer hands over to
  the next one at once (a second such exit in a row within a minute of its start waits, with the crash backoff:
  every experiment may be refusing); when a share's slice is used, the child stops as cleanly as for a pause and
  the next experiment starts;
- a child that exits on its own is restarted with exponential backoff (reset after a healthy run);
- every tick writes :class:`ServiceState` to ``<state_dir>/service/state.json``, which ``swarmhub service
  status`` reads. The child writes its progress (step, samples/s, last acknowledged report) to
  ``progress.json`` beside it (``join --progress-file``), and the runner copies it in.

The clock, the condition checks and the command line of the child are parameters, so tests drive the decision
loop with a fake clock, a fake power-supply tree and a stand-in child.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Protocol

from swarmhub.common.choice import Chooser, InOrder, JoinableExperiment, MostNeeded, NothingToJoin, Pick, Shares
from swarmhub.worker.client import ExitCode, WorkerError
from swarmhub.worker.service.limits import CpuSampler, ServiceConfig, on_battery
from swarmhub.worker.service.state import ServiceState, read_progress, write_json_atomically

logger = logging.getLogger("swarmhub.worker.service")

BACKOFF_FIRST = 5.0
BACKOFF_MAX = 600.0
HEALTHY_RUN = 600.0  # a child that ran this long before crashing restarts after the first backoff again
STOP_GRACE = 90.0  # the child's clean leave: the reporter's flush and hivemind's shutdown
RECHECK = 60.0  # with nothing to join (or the server unreachable), ask the server again after this long
# Exit codes about the experiment rather than this machine: the next experiment in the list gets its turn.
HAND_OVER = {ExitCode.NOT_FOUND, ExitCode.NOT_ACCEPTING, ExitCode.REMOVED}
# A hand-over goes to the next experiment at once, unless the join before it also handed over this quickly: then
# every experiment may be refusing, and the next start waits as after a crash (the same growing backoff).
QUICK_HAND_OVER = 60.0
# What an exit code of `join` means, for `swarmhub service status` (the join's own line is in the journal).
EXIT_MEANING = {
    ExitCode.USAGE: "a bad option or limit",
    ExitCode.AUTH: "not logged in or token rejected: run `swarmhub login`",
    ExitCode.NOT_FOUND: "unknown experiment: check `experiments` in config.toml",
    ExitCode.UNREACHABLE: "server unreachable",
    ExitCode.NOT_ACCEPTING: "the experiment is not accepting volunteers",
    ExitCode.CLOCK: "this machine's clock is off: sync it",
    ExitCode.REMOVED: "removed by the organizer",
    ExitCode.UPGRADE: "this swarmhub is too old for the hub's swarm: `swarmhub upgrade`",
}


class Clock(Protocol):
    def now(self) -> datetime: ...  # local wall time, for the hours
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@dataclass
class Conditions:
    """Why training must pause now, if it must: the hours, the battery, other programs' CPU load."""

    config: ServiceConfig
    battery: Callable[[], bool] = on_battery
    busy: Callable[[], float | None] | None = None  # other programs' CPU share, e.g. CpuSampler.others_share

    def pause_reason(self, now: datetime) -> str | None:
        window = self.config.window
        if window is not None and not window.contains(now):
            return f"outside the hours {window}"
        if self.config.pause_on_battery and self.battery():
            return "on battery"
        if self.config.pause_when_busy and self.busy is not None:
            share = self.busy()
            if share is not None and share > self.config.busy_threshold:
                return f"busy: other programs use {share:.0%} of the CPU"
        return None


def join_command(
    config: ServiceConfig,
    executable: list[str] | None = None,
    listen: Sequence[str] = (),
    insecure: bool = False,
    extra: Sequence[str] = (),
) -> Callable[[str, Path], list[str]]:
    """The child's command line for experiment ``slug``: ``swarmhub join`` with the volunteer's limits (and
    ``extra`` options of ``join``)."""
    base = executable or [sys.executable, "-m", "swarmhub.worker.cli.main"]

    def command(slug: str, progress_file: Path) -> list[str]:
        argv = [*base, "join", slug, "--progress-file", str(progress_file)]
        for maddr in listen:
            argv += ["--listen", maddr]
        if insecure:
            argv.append("--insecure")
        if config.cpu_threads is not None:
            argv += ["--cpu-threads", str(config.cpu_threads)]
        if config.gpu_memory_fraction is not None:
            argv += ["--gpu-memory-fraction", str(config.gpu_memory_fraction)]
        return [*argv, *extra]

    return command


def chooser_for(config: ServiceConfig, fetch: Callable[[], list[JoinableExperiment]] | None = None) -> Chooser:
    """How ``config`` chooses the experiment; ``fetch`` lists the joinable ones (``any``, see :mod:`.choice`)."""
    if config.any:
        if fetch is None:
            raise ValueError("any = true needs a way to list the joinable experiments")
        return MostNeeded(fetch)
    shares = config.shares
    if shares is not None:
        return Shares(shares, config.share_period_minutes * 60)
    return InOrder(config.slugs)


class Runner:
    """Supervises the ``join`` child; see the module docstring. :meth:`run` loops :meth:`tick` until stopped."""

    def __init__(
        self,
        config: ServiceConfig,
        state_dir: Path,
        *,
        command: Callable[[str, Path], list[str]],
        conditions: Conditions,
        clock: Clock | None = None,
        poll: float = 5.0,
        settle: float = 60.0,
        stop_grace: float = STOP_GRACE,
        backoff_first: float = BACKOFF_FIRST,
        backoff_max: float = BACKOFF_MAX,
        recheck: float = RECHECK,
        env: dict[str, str] | None = None,
        fetch: Callable[[], list[JoinableExperiment]] | None = None,
    ):
        self.config = config
        self.chooser = chooser_for(config, fetch)
        self.state_path = state_dir / "state.json"
        self.progress_path = state_dir / "progress.json"
        self.command = command
        self.conditions = conditions
        self.clock: Clock = clock or SystemClock()
        self.poll = poll
        self.settle = settle
        self.stop_grace = stop_grace
        self.backoff_first = backoff_first
        self.backoff_max = backoff_max
        self.recheck = recheck
        self.env = env
        self.child: subprocess.Popen[bytes] | None = None
        self.picked: Pick | None = None
        self.slice_used = 0.0  # running seconds of the current share's slice before the child's latest start
        self.restarts = 0
        self.failures = 0  # consecutive crashes: the backoff's exponent
        self.quick_hand_over = False  # the last exit handed over within QUICK_HAND_OVER seconds of its start
        self.last_exit: int | None = None
        self.started_at = 0.0
        self.not_before = 0.0  # backoff: no start before this monotonic time
        self.clear_since: float | None = None  # when the pause condition last cleared
        self.paused_for: str | None = None
        self.stopping = False
        self.stopped_by: int | None = None  # the signal that ended :meth:`run`
        self.waiting_for: str | None = None  # why nothing was started when the chooser was last asked

    @property
    def experiment(self) -> str | None:
        return self.chooser.current()

    def slice_left(self, now: float) -> float | None:
        """Running seconds left in the current share's slice (None: no slices)."""
        limit = self.chooser.slice_seconds()
        if limit is None:
            return None
        running = now - self.started_at if self.child is not None else 0.0
        return limit - self.slice_used - running

    # -- one decision --------------------------------------------------------------------------------------

    def tick(self) -> ServiceState:
        now = self.clock.monotonic()
        self._reap(now)
        reason = self.conditions.pause_reason(self.clock.now())
        if reason is not None:
            self.clear_since = None
            if self.child is not None:
                logger.info("pausing %s: %s", self.experiment, reason)
                self._stop_child()
            self.paused_for = reason
            return self._record("paused", reason)
        if self.paused_for is not None:
            self.clear_since = now if self.clear_since is None else self.clear_since
            if now - self.clear_since < self.settle:
                return self._record("paused", f"{self.paused_for} (cleared, resuming shortly)")
            logger.info("resuming: %s cleared", self.paused_for)
            self.paused_for = None
        left = self.slice_left(now)
        if self.child is not None and left is not None and left <= 0:
            logger.info("the slice of %s is used: the next experiment's turn", self.experiment)
            self._stop_child()  # the clean leave, as for a pause: unsent metrics stay in the spool
            self._next_slice()
        if self.child is None:
            if now < self.not_before:
                if self.waiting_for is not None:  # nothing to join when last asked
                    return self._record("waiting", self.waiting_for)
                why = f"restarting {self.experiment} in {self.not_before - now:.0f} s after exit code {self.last_exit}"
                if self.last_exit in EXIT_MEANING:
                    why += f" ({EXIT_MEANING[ExitCode(self.last_exit)]})"
                return self._record("waiting", why)
            try:
                picked = self.chooser.pick()
            except NothingToJoin as exc:
                return self._wait_for_choice(now, str(exc))
            except WorkerError as exc:  # the server's list of joinable experiments (--any)
                return self._wait_for_choice(now, f"cannot list the experiments you may join: {exc.message}")
            self.waiting_for = None
            if picked != self.picked:
                logger.info("joining %s: %s", picked.slug, picked.why)
                self.picked = picked
            self._start_child(now, picked.slug)
        return self._record("running", None)

    def _wait_for_choice(self, now: float, why: str) -> ServiceState:
        if why != self.waiting_for:
            logger.warning("nothing to join: %s", why)
        self.waiting_for = why
        self.not_before = now + self.recheck
        return self._record("waiting", why)

    def _next_slice(self) -> None:
        self.chooser.next_slice()
        self.slice_used = 0.0

    def _reap(self, now: float) -> None:
        if self.child is None or self.child.poll() is None:
            return
        code = self.child.returncode
        self.child = None
        self.last_exit = code
        ran = now - self.started_at
        self.failures = 1 if ran >= HEALTHY_RUN else self.failures + 1
        self.restarts += 1
        self.slice_used += ran
        handed_over = code in HAND_OVER and self.chooser.hand_over()
        if handed_over:
            self.slice_used = 0.0
        quick = handed_over and ran < QUICK_HAND_OVER
        at_once = handed_over and not (quick and self.quick_hand_over)  # experiment after experiment refusing waits
        self.quick_hand_over = quick
        if at_once:
            self.failures = 0
            delay = 0.0
        else:
            delay = min(self.backoff_max, self.backoff_first * 2 ** (self.failures - 1))
        self.not_before = now + delay
        logger.warning("the join exited with code %s after %.0f s: next start in %.0f s", code, ran, delay)

    def _start_child(self, now: float, slug: str) -> None:
        self.progress_path.unlink(missing_ok=True)
        argv = self.command(slug, self.progress_path)
        logger.info("starting: %s", " ".join(argv))
        # Its own session: a Ctrl-C on the runner's terminal reaches the child once, through the runner.
        self.child = subprocess.Popen(argv, env=self.env, start_new_session=True)
        self.started_at = now

    def _stop_child(self) -> None:
        """SIGINT (leave the swarm cleanly), then SIGTERM (forces), then SIGKILL; waits for the exit."""
        child, self.child = self.child, None
        if child is None:
            return
        self.slice_used += self.clock.monotonic() - self.started_at
        for sig, grace in ((signal.SIGINT, self.stop_grace), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(sig)
            try:
                child.wait(grace)
                break
            except subprocess.TimeoutExpired:
                logger.warning("the join did not stop after %s: sending the next signal", signal.Signals(sig).name)
        self.last_exit = child.returncode
        self.not_before = 0.0

    def _record(self, state: Literal["running", "paused", "waiting", "stopped"], reason: str | None) -> ServiceState:
        record = ServiceState(
            state=state,
            reason=reason,
            experiment=self.experiment,
            chosen=self._chosen(),
            pid=os.getpid(),
            restarts=self.restarts,
            last_exit_code=self.last_exit,
            progress=read_progress(self.progress_path),
            updated_at=datetime.now(timezone.utc),
        )
        write_json_atomically(self.state_path, record.model_dump_json(indent=2))
        return record

    def _chosen(self) -> str | None:
        if self.picked is None or self.picked.slug != self.experiment:
            return None
        left = self.slice_left(self.clock.monotonic())
        if left is None:
            return self.picked.why
        return f"{self.picked.why}; {max(0.0, left) / 60:.1f} min of this slice left"

    # -- the loop ------------------------------------------------------------------------------------------

    def run(self) -> int:
        """Tick every ``poll`` seconds until SIGINT/SIGTERM; then stop the child cleanly and return 0."""

        def stop(signum: int, frame: object) -> None:
            self.stopping = True
            self.stopped_by = signum

        previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not self.stopping:
                self.tick()
                slept = 0.0
                while slept < self.poll and not self.stopping:
                    self.clock.sleep(min(0.5, self.poll - slept))
                    slept += 0.5
        finally:
            self.close()
            for sig, old in previous.items():
                signal.signal(sig, old)
        return ExitCode.OK

    def close(self) -> None:
        self._stop_child()
        self._record("stopped", "the service was stopped")


def default_conditions(config: ServiceConfig, power_root: Path | None = None) -> Conditions:
    battery = (lambda: on_battery(power_root)) if power_root is not None else on_battery
    busy = CpuSampler(os.getpid()).others_share if sys.platform.startswith("linux") else None
    return Conditions(config, battery=battery, busy=busy)
