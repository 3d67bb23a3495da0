"""Shared harness of the benchmarks in ``bench/`` (not a benchmark itself).

- :class:`Harness` starts every process a benchmark needs in its own process group, tagged with a unique
  environment variable that hivemind's children (DHT, averagers, ``p2pd``) inherit, and on exit stops them
  (gracefully first, then ``killpg``) and checks that no tagged process, ``p2pd`` included, is left behind.
- :meth:`Harness.swarm_peer` starts the server's bootstrap/monitor peer (``python -m
  swarmhub.server.swarm.bootstrap_peer``) with a signing key file, and :func:`join_json` the JoinResponse the
  server would answer. The process tools under both (the tag, the stdout reader, the peer's command line, the
  join answer, the health check) are the tests' own, imported from ``tests/swarm_processes.py``: one copy.
- :meth:`Harness.worker` starts ``bench/_worker.py`` in one of its modes; workers print JSON lines on stdout.
- Statistics (median and spread) and table printing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the process tools the tests use too: tests/swarm_processes.py

from tests.swarm_processes import (  # noqa: E402
    LineReader,
    OutputError,
    bootstrap_peer_command,
    make_join,
    tagged_env,
    wait_gone,
)
from tests.swarm_processes import wait_healthy as wait_healthy  # noqa: E402 - for the server benchmarks

WORKER_SCRIPT = Path(__file__).resolve().with_name("_worker.py")

# The workload of the throughput benchmarks: one step is ~30 ms of compute on one thread of this 2-core
# machine (digits' MLP at its widest, 512 samples a step), so per-step swarm costs are not drowned out.
HIDDEN_SIZE = 4096
BATCH_SIZE = 512


BenchError = OutputError  # something the benchmark needs did not work (a process did not print its event): exit 1


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[str]
    reader: LineReader
    log: Path
    stop_signal: int | None = None  # how to stop it gracefully: None closes its stdin

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.reader.events

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.popen.stdin is not None:
                self.popen.stdin.close()

    def request_stop(self) -> None:
        if self.stop_signal is None:
            self.close_stdin()
        elif self.popen.poll() is None:
            self.popen.send_signal(self.stop_signal)


@dataclass
class SwarmPeer:
    proc: Proc
    run_id: str
    maddrs: list[str]
    signing_key: Any  # hivemind RSAPrivateKey


@dataclass
class Harness:
    """Owns the temp folder and every process of one benchmark run; use as a context manager."""

    prefix: str
    tag: str = field(default_factory=lambda: f"bench-{uuid.uuid4().hex}")
    procs: list[Proc] = field(default_factory=list)
    tmp: Path = field(init=False)
    keep_tmp: bool = field(default_factory=lambda: bool(os.environ.get("SWARMHUB_BENCH_KEEP")))

    def __post_init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=f"swarmhub-bench-{self.prefix}-"))
        if self.keep_tmp:
            print(f"logs kept in {self.tmp} (SWARMHUB_BENCH_KEEP)", flush=True)

    def __enter__(self) -> Harness:
        # SIGTERM (and SIGHUP) stop the benchmark like Ctrl-C does: through the cleanup below.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _raise_interrupt)
        return self

    def __exit__(self, *exc: object) -> None:
        left = self.shutdown()
        if not self.keep_tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
        if left:
            raise BenchError(f"processes survived SIGKILL: {left}")

    def env(self, **extra: str) -> dict[str, str]:
        return tagged_env(self.tag, **extra)

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, stop_signal: int | None = None
    ) -> Proc:
        log = self.tmp / f"{name}.log"
        with open(log, "w") as err:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,  # the process stops when its stdin closes
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=env or self.env(),
                cwd=ROOT,
                start_new_session=True,  # its own process group: killpg reaches hivemind's children too
            )
        copy = self.tmp / f"{name}.out.jsonl" if self.keep_tmp else None
        proc = Proc(name, popen, LineReader(popen, name, copy), log, stop_signal)
        self.procs.append(proc)
        return proc

    def worker(self, name: str, mode: str, config: dict[str, Any]) -> Proc:
        return self.spawn(name, [sys.executable, str(WORKER_SCRIPT), mode, json.dumps(config)])

    def swarm_peer(self, name: str, run_id: str | None = None, timeout: float = 60) -> SwarmPeer:
        """The server's bootstrap + monitor peer for a new run, started as the server starts it."""
        return self.swarm_peers([name], timeout=timeout, run_ids=[run_id])[0]

    def swarm_peers(
        self, names: Sequence[str], timeout: float = 60, run_ids: Sequence[str | None] | None = None
    ) -> list[SwarmPeer]:
        """Several swarm peers (one run each), started at the same time."""
        from swarmhub.worker.swarm import access as swarm_access

        started = []
        for name, run_id in zip(names, run_ids or [None] * len(names), strict=True):
            run_id = run_id or f"bench-{uuid.uuid4().hex[:8]}"
            folder = self.tmp / name
            folder.mkdir()
            argv, key_text = bootstrap_peer_command(folder, run_id)
            started.append((self.spawn(name, argv), run_id, key_text))
        peers = []
        for proc, run_id, key_text in started:
            try:
                ready = proc.reader.wait_for("ready", timeout)
            except BenchError as exc:
                raise BenchError(f"{exc}\n{proc.log_tail()}") from None
            peers.append(SwarmPeer(proc, run_id, ready["maddrs"], swarm_access.signing_key_from_text(key_text)))
        return peers

    def stop(self, procs: Sequence[Proc], timeout: float = 20.0) -> list[int | None]:
        """Ask each to stop (close its stdin: the graceful stop of every worker mode and of the swarm peer;
        or its ``stop_signal``), then wait; SIGTERM, then SIGKILL to the group, for what does not exit within
        ``timeout``. Returns the exit codes (None: it had to be terminated).

        A worker stopped in the middle of an averaging round whose partner already left waits for that
        round's ``averaging_timeout`` before it can leave: ``timeout`` bounds that wait."""
        for proc in procs:
            proc.request_stop()
        deadline = time.monotonic() + timeout
        codes: list[int | None] = []
        for proc in procs:
            try:
                codes.append(proc.popen.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                _signal_group(proc.popen, signal.SIGTERM)
                try:
                    proc.popen.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _signal_group(proc.popen, signal.SIGKILL)
                    proc.popen.wait(timeout=10)
                codes.append(None)
            proc.reader.join(5)
        # hivemind's children (p2pd, averagers) may outlive their parent by a moment; then they must go
        for proc in procs:
            _wait_group_gone(proc.popen.pid, timeout=10)
            _signal_group(proc.popen, signal.SIGKILL)
        return codes

    def shutdown(self) -> list[str]:
        """Stop everything still running; returns descriptions of tagged processes that survived SIGKILL."""
        running = [proc for proc in self.procs if proc.popen.poll() is None]
        if running:
            self.stop(running, timeout=30)
        for proc in self.procs:
            _signal_group(proc.popen, signal.SIGKILL)
        left = wait_gone(self.tag, timeout=15)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        left = wait_gone(self.tag, timeout=5)
        return [_describe(p) for p in left]

    def check_no_leftovers(self, grace: float = 15.0) -> str:
        """After the benchmark's processes were stopped: wait ``grace`` seconds for every tagged process to be
        gone (helpers such as torch_shm_manager take a moment to notice that their parent is gone), kill what
        is still there, and say so. Raises only when something survives SIGKILL."""
        for proc in self.procs:
            _signal_group(proc.popen, signal.SIGKILL)
        left = wait_gone(self.tag, timeout=grace)
        if not left:
            return "cleanup: no process left behind (no tagged process, no p2pd)"
        names = sorted(_describe(p) for p in left)
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        survivors = wait_gone(self.tag, timeout=5)
        if survivors:
            raise BenchError(f"left behind, surviving SIGKILL: {[_describe(p) for p in survivors]}")
        p2pd = [n for n in names if n.startswith("p2pd")]
        warning = f" WARNING: {len(p2pd)} p2pd among them" if p2pd else " (no p2pd among them)"
        return (
            f"cleanup: {len(names)} process(es) outlived their parents by {grace:.0f} s, then killed: {names}{warning}"
        )


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _signal_group(popen: subprocess.Popen[str], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)  # start_new_session=True: the group id is the pid


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)


def _name(p: psutil.Process) -> str:
    try:
        return p.name()
    except psutil.Error:
        return "?"


def _describe(p: psutil.Process) -> str:
    return f"{_name(p)}[{p.pid}]"


def other_p2pd() -> int:
    """p2pd processes of anyone on this machine (for the report: they compete for the 2 cores)."""
    count = 0
    for proc in psutil.process_iter(["name"]):
        if proc.info.get("name") == "p2pd":
            count += 1
    return count


# -- swarm configuration ------------------------------------------------------------------------------------


def experiment_config(
    *,
    hidden_size: int = HIDDEN_SIZE,
    batch_size: int = BATCH_SIZE,
    target_batch_size: int,
    learning_rate: float = 1e-3,
    matchmaking_time: float = 3.0,
    averaging_timeout: float = 30.0,
    overlap: str | None = None,
) -> dict[str, Any]:
    """An experiment as the server stores it (the fields of ``ExperimentConfig`` less slug and title); ``overlap``
    unset is the experiment default (``none``: the step waits for gradient averaging)."""
    extra = {"overlap": overlap} if overlap is not None else {}
    return {
        **extra,
        "task": "digits",
        "task_params": {"hidden_size": hidden_size, "batch_size": batch_size},
        "optimizer": "adam",
        "learning_rate": learning_rate,
        "target_batch_size": target_batch_size,
        "matchmaking_time": matchmaking_time,
        "averaging_timeout": averaging_timeout,
    }


def bare_loop_config(experiment: dict[str, Any]) -> dict[str, Any]:
    """The bare loop's options (``_worker.py`` mode ``bare``) for the workload of an :func:`experiment_config`."""
    return {
        "hidden_size": experiment["task_params"]["hidden_size"],
        "batch_size": experiment["task_params"]["batch_size"],
        "learning_rate": experiment["learning_rate"],
    }


def join_json(peer: SwarmPeer, worker_id: str, identity: Path, experiment: dict[str, Any]) -> str:
    """What the server's join answers (as JSON) for the key at ``identity``, for an experiment as
    :func:`experiment_config` describes it: the tests' ``make_join`` (tests/swarm_processes.py)."""
    from swarmhub.common.protocol import ExperimentConfig

    config = ExperimentConfig(slug="bench-digits", title="Benchmark digits", **experiment)
    return make_join(peer, worker_id, identity, config, username="bench").model_dump_json()


# -- measurement ---------------------------------------------------------------------------------------------


def progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("event") == "progress"]


def epoch_rate(events: list[dict[str, Any]], t0: float, t1: float) -> tuple[float, int, float] | None:
    """Samples/s of one worker over whole swarm epochs: from its first epoch change at or after ``t0`` to its
    last one at or before ``t1`` (the events a worker prints when its epoch changes). Returns (rate, epochs,
    seconds), or None when the window holds fewer than two epoch changes."""
    changes = [e for e in progress(events) if e.get("epoch_change") and t0 <= e["t"] <= t1]
    if len(changes) < 2:
        return None
    first, last = changes[0], changes[-1]
    seconds = last["t"] - first["t"]
    if seconds <= 0:
        return None
    return (last["samples"] - first["samples"]) / seconds, last["epoch"] - first["epoch"], seconds


def time_rate(events: list[dict[str, Any]], t0: float, t1: float) -> tuple[float, float] | None:
    """Samples/s between the first and the last progress event inside [t0, t1]: (rate, seconds)."""
    inside = [e for e in progress(events) if t0 <= e["t"] <= t1]
    if len(inside) < 2:
        return None
    seconds = inside[-1]["t"] - inside[0]["t"]
    if seconds <= 0:
        return None
    return (inside[-1]["samples"] - inside[0]["samples"]) / seconds, seconds


def rate(events: list[dict[str, Any]], t0: float, t1: float) -> tuple[float, str] | None:
    """:func:`epoch_rate` when the window holds two epoch changes or more, else :func:`time_rate`; with a note
    on what was measured ("3 epochs/19.8 s" or "time 19.8 s")."""
    by_epoch = epoch_rate(events, t0, t1)
    if by_epoch is not None:
        value, epochs, seconds = by_epoch
        return value, f"{epochs} ep/{seconds:.1f}s"
    by_time = time_rate(events, t0, t1)
    if by_time is not None:
        return by_time[0], f"time {by_time[1]:.1f}s"
    return None


def samples_at(events: list[dict[str, Any]], t: float) -> float:
    """A worker's sample count at time ``t``, linearly interpolated between its progress lines. After its last
    line the count is that line's: a worker prints at least every 2 s while it trains, so a worker that printed
    nothing since was blocked (in an averaging round) or had stopped."""
    points = progress(events)
    if not points or t <= points[0]["t"]:
        return float(points[0]["samples"]) if points else 0.0
    for a, b in zip(points, points[1:], strict=False):
        if a["t"] <= t <= b["t"]:
            span = b["t"] - a["t"]
            return a["samples"] + (b["samples"] - a["samples"]) * ((t - a["t"]) / span if span > 0 else 1.0)
    return float(points[-1]["samples"])


def swarm_rate(procs: Sequence[Proc], t0: float, t1: float) -> tuple[float, str]:
    """Samples/s of all ``procs`` together over one common interval: from ``t0`` to the last epoch change any of
    them printed before ``t1`` (so the interval holds whole swarm epochs when it starts at one), or to ``t1`` when
    there is none in the second half of the window. Each worker's count is interpolated at both ends."""
    changes = sorted(t for p in procs for t in epoch_changes(p, t0) if t <= t1)
    end = changes[-1] if changes and changes[-1] - t0 >= 0.5 * (t1 - t0) else t1
    total = sum(samples_at(p.events, end) - samples_at(p.events, t0) for p in procs)
    epochs = {e["epoch"] for p in procs for e in progress(p.events) if e.get("epoch_change") and t0 < e["t"] <= end}
    how = f"{len(epochs)} epochs/{end - t0:.1f}s" if end != t1 else f"time {end - t0:.1f}s"
    return total / (end - t0), how


def longest_silence(procs: Sequence[Proc], t0: float, t1: float) -> float:
    """The longest time any of ``procs`` printed nothing within [t0, t1]: a worker that trains prints at least
    every 2 s, so anything much longer is time it spent blocked (in an averaging round, or waiting for one)."""
    longest = 0.0
    for p in procs:
        times = [t0, *(e["t"] for e in progress(p.events) if t0 < e["t"] < t1), t1]
        longest = max(longest, *(b - a for a, b in zip(times, times[1:], strict=False)))
    return longest


def epoch_changes(proc: Proc, since: float = 0.0) -> list[float]:
    return [e["t"] for e in progress(proc.events) if e.get("epoch_change") and e["t"] >= since]


def wait_epochs(procs: Sequence[Proc], epochs: int, timeout: float, since: float = 0.0) -> float:
    """Until every worker has printed ``epochs`` epoch changes after ``since``; returns a time just before the
    earliest of their last counted changes (the start of a window that begins at those changes)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        changes = [epoch_changes(p, since) for p in procs]
        if all(len(c) >= epochs for c in changes):
            return min(c[epochs - 1] for c in changes) - 0.01
        check_alive(procs)
        time.sleep(0.2)
    raise BenchError(f"workers did not reach {epochs} epoch changes within {timeout:.0f} s")


def wait_progress(procs: Sequence[Proc], timeout: float) -> float:
    """Until every worker has printed a progress event (it trains); returns the time of the last first one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        firsts = [progress(p.events)[:1] for p in procs]
        if all(firsts):
            return max(f[0]["t"] for f in firsts)
        check_alive(procs)
        time.sleep(0.2)
    raise BenchError(f"workers did not start training within {timeout:.0f} s")


def check_alive(procs: Sequence[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is not None:
            raise BenchError(f"{p.name} exited early ({p.popen.returncode}):\n{p.log_tail()}")


def sleep_until(t: float) -> None:
    time.sleep(max(t - time.time(), 0.0))


def cpu_seconds(procs: Sequence[Proc]) -> dict[str, tuple[float, float]]:
    """CPU seconds (user + system) so far of each process, and of all its descendants (hivemind's DHT,
    averagers and p2pd): what competes with the training threads for the cores."""
    out = {}
    for proc in procs:
        try:
            main = psutil.Process(proc.popen.pid)
            t = main.cpu_times()
            helpers = 0.0
            for child in main.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    c = child.cpu_times()
                    helpers += c.user + c.system
            out[proc.name] = (t.user + t.system, helpers)
        except psutil.Error:
            continue
    return out


def cpu_share(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]], seconds: float) -> str:
    """Cores used over a window, per process: main process + its helper processes."""
    parts = []
    for name, (main1, help1) in after.items():
        if name in before:
            main0, help0 = before[name]
            parts.append(f"{name} {(main1 - main0) / seconds:.2f}+{(help1 - help0) / seconds:.2f}")
    return ", ".join(parts)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def spread(values: Sequence[float]) -> str:
    """min..max of the repeats (with 2-3 repeats, a range says more than a standard deviation)."""
    if not values:
        return "-"
    return f"{min(values):,.3g}..{max(values):,.3g}"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for n, row in enumerate(cells):
        lines.append(
            "| "
            + " | ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
            + " |"
        )
        if n == 0:
            lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3f}"
    return str(value)


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


class BareLoop:
    """The hand-written PyTorch loop the worker is compared with: forward (under autocast when ``precision`` is
    bf16 or fp16, as the worker computes on a CUDA device), backward, an Adam step per batch, on ``device``.
    fp16 scales the loss with PyTorch's GradScaler, as the worker does."""

    def __init__(
        self,
        hidden_size: int,
        batch_size: int,
        device: str = "cpu",
        precision: str = "fp32",
        seed: int = 0,
        learning_rate: float = 1e-3,
    ):
        import torch

        from swarmhub.worker.tasks import get_task

        self.device = torch.device(device)
        self.task = get_task("digits")({"hidden_size": hidden_size, "batch_size": batch_size})
        self.model = self.task.build_model().to(self.device)
        self.adam = torch.optim.Adam(self.model.parameters(), lr=learning_rate)
        self.batches = self.task.batches(seed)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if precision == "fp16" else None
        self.model.train()

    def step(self) -> Any:
        """One step; returns the loss as a tensor (reading it is a device synchronisation: the caller chooses when)."""
        import torch

        with torch.autocast(self.device.type, dtype=self.dtype or torch.float32, enabled=self.dtype is not None):
            loss = self.task.loss(self.model, next(self.batches), self.device)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.adam)
            self.scaler.update()
        else:
            loss.backward()
            self.adam.step()
        self.adam.zero_grad()
        return loss

    def synchronize(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def bare_rate(
    hidden_size: int, batch_size: int, seconds: float = 2.0, device: str = "cpu", precision: str = "auto"
) -> float:
    """Samples/s of a bare loop (forward, backward, Adam step) of the digits workload on one thread of this
    machine (on ``device``, in ``precision``; ``auto``: what the worker picks there): what the benchmarks size their
    target batch with, so that epochs last as long on any machine."""
    import torch

    from swarmhub.worker.training.peer import resolve_precision

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loop = BareLoop(hidden_size, batch_size, device, resolve_precision(precision, torch.device(device)))
        steps, start = -3, 0.0  # three warm-up steps
        while steps < 3 or time.perf_counter() - start < seconds:
            if steps == 0:
                loop.synchronize()
                start = time.perf_counter()
            loop.step()
            steps += 1
        loop.synchronize()
        return steps * batch_size / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def batch_for(workers: int, rate: float, seconds: float, batch_size: int) -> int:
    """The target batch size (a multiple of the local batch) that ``workers`` workers at ``rate`` samples/s each
    gather in ``seconds``."""
    return max(round(workers * rate * seconds / batch_size), 1) * batch_size


def sized_target(
    fixed: int | None,
    workers: int,
    seconds: float,
    hidden_size: int,
    batch_size: int,
    device: str = "cpu",
    precision: str = "auto",
) -> int:
    """A benchmark's target batch: ``fixed`` (its ``--target-batch-size``) when given, else what ``workers``
    workers gather in ``seconds`` at the rate a 2 s bare loop measures now on ``device`` (printed, with the
    target)."""
    if fixed is not None:
        return fixed
    bare = bare_rate(hidden_size, batch_size, device=device, precision=precision)
    target = batch_for(workers, bare, seconds, batch_size)
    where = "one thread" if device == "cpu" else f"{device} in {precision} (one CPU thread)"
    print(
        f"calibration: a bare loop of the workload trains {bare:,.0f} samples/s on {where} here: target batch "
        f"{target:,}, {seconds:g} s of the bare loop's samples for {workers} worker(s)"
    )
    return target


def summary_row(label: str, values: Sequence[float]) -> list[Any]:
    """A results table's row: the label, each round's value, their median and their min..max."""
    return [label, *values, median(values), spread(values)]


def machine_line() -> str:
    import platform

    import torch

    return (
        f"machine: {os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
        f"torch {torch.__version__}, cuda={'yes' if torch.cuda.is_available() else 'no'}; "
        f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())} at start"
    )


class MachineLoad:
    """How much of the machine processes outside this benchmark used while it ran: all CPU time of the machine
    less this process's and its (waited-for) descendants'. Call :meth:`line` after every process has ended."""

    def __init__(self) -> None:
        self.wall = time.monotonic()
        self.system = _busy_seconds()
        self.own = _own_seconds()

    def line(self) -> str:
        wall = time.monotonic() - self.wall
        total = _busy_seconds() - self.system
        own = _own_seconds() - self.own
        others = max(total - own, 0.0)
        return (
            f"machine load during the run: this benchmark {own / wall:.2f} cores, other processes "
            f"{others / wall:.2f} cores (of {os.cpu_count()}); load average now "
            f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )


def _busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def _own_seconds() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    started = time.monotonic()
    print(f"  .. {name}", flush=True)
    yield
    print(f"     ({time.monotonic() - started:.0f} s)", flush=True)


def add_overlap_option(parser: Any, help: str) -> None:
    """``--overlap``: the experiment's overlap setting (the values the experiment takes besides ``auto``)."""
    parser.add_argument("--overlap", choices=["none", "delayed-step", "delayed-averaging"], default=None, help=help)
