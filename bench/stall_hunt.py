"""Stall hunt: catch a gradient round that holds a worker far longer than its chunk timeouts, and record where
every process of the swarm waits at that moment.

A two-peer gradient round has now and then held one worker for up to ``averaging_timeout`` (30 s) while its partner
went on after hivemind's 3 s chunk timeouts (docs/benchmarks/swarm-efficiency.md). This script repeats the benchmark's
staggered join until that happens: the server's bootstrap/monitor peer and worker A, then B joins ``--join-after``
seconds after A's first step, and both train ``--window`` seconds. A watcher thread checks every 0.5 s: a worker
that has printed progress and then nothing for ``--stall`` seconds (a training worker prints at least every 2 s) is
stalled. Then every Python process of the run (workers, their hivemind DHT and averager processes, the server's
peer) writes its threads' stacks and every pending asyncio task's chain of awaits (``bench/_taskdump``, SIGUSR2),
and ``py-spy dump`` of each is saved when py-spy is installed; the run's logs are kept and the folder is printed.

``--load N`` adds N background processes that burn CPU in random bursts (0.5 to 3 s busy, 0.5 to 2 s idle), for
machines where the stall needs contention. ``--efficiency [ARGS]`` runs ``bench/swarm_efficiency.py ARGS`` under the
same watcher instead (every swarmhub worker of every round is watched; the logs are kept).

Command: ``.venv/bin/python bench/stall_hunt.py [--runs 12] [--window 40] [--load 2]``; ``.venv/bin/python
bench/stall_hunt.py --efficiency --rounds 4``. Prints one line a run and the count of stalls; exits 0 whether or
not a stall was caught. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _common as c
import psutil

TASKDUMP = Path(__file__).resolve().parent / "_taskdump"
SILENT_AT_START = 3  # progress lines a worker prints before its silences count (startup and state download)


class Watcher:
    """Watches the swarmhub workers of one harness; dumps every Python process of the harness on a stall."""

    def __init__(self, h: c.Harness, stall: float, folder: Path):
        self.h, self.stall, self.folder = h, stall, folder
        self.stalled: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            now = time.time()
            for proc in list(self.h.procs):
                stopping = proc.popen.stdin is None or proc.popen.stdin.closed  # asked to stop: silent by design
                if "swarmhub" not in proc.name or stopping or proc.popen.poll() is not None:
                    continue
                if proc.name in self.stalled:
                    continue
                events = c.progress(proc.events)
                if len(events) >= SILENT_AT_START and now - events[-1]["t"] > self.stall:
                    self.stalled.append(proc.name)
                    print(f"  stall: {proc.name} silent {now - events[-1]['t']:.1f} s; dumping", flush=True)
                    self.dump()

    def dump(self) -> None:
        groups = set()
        for proc in self.h.procs:
            if proc.popen.poll() is None:
                try:
                    groups.add(os.getpgid(proc.popen.pid))
                except ProcessLookupError:
                    pass
        py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        for p in psutil.process_iter(["pid", "name"]):
            try:
                if os.getpgid(p.pid) not in groups or "python" not in (p.info["name"] or ""):
                    continue
                os.kill(p.pid, signal.SIGUSR2)
                if Path(py_spy).exists():
                    spy = subprocess.run([py_spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True,
                                         timeout=30)  # fmt: skip
                    (self.folder / f"py-spy-{p.pid}.txt").write_text(spy.stdout + spy.stderr)
            except (ProcessLookupError, psutil.Error, subprocess.TimeoutExpired, PermissionError):
                continue


def burn(seed: int) -> None:
    rng = random.Random(seed)
    while True:
        busy_until = time.monotonic() + rng.uniform(0.5, 3.0)
        while time.monotonic() < busy_until:
            sum(i * i for i in range(10_000))
        time.sleep(rng.uniform(0.5, 2.0))


def staggered_run(h: c.Harness, r: int, args: argparse.Namespace, experiment: dict[str, Any]) -> str:
    peer = h.swarm_peer(f"r{r}-peer")

    def start(name: str) -> c.Proc:
        identity = h.tmp / f"r{r}-{name}.key"
        join = c.join_json(peer, f"worker-{name}", identity, experiment)
        return h.worker(f"r{r}-swarmhub-{name}", "swarmhub", {"join": join, "identity": str(identity)})

    a = start("A")
    c.wait_progress([a], 120)
    time.sleep(args.join_after)
    b = start("B")
    joined = c.wait_progress([b], 120)
    watcher = Watcher(h, args.stall, Path(os.environ["SWARMHUB_TASKDUMP_DIR"]))
    try:
        c.sleep_until(joined + args.window)
    finally:
        watcher.close()
    silence = c.longest_silence([a, b], joined, time.time())
    changes = [len(c.epoch_changes(w, joined)) for w in (a, b)]
    h.stop([a, b, peer.proc], timeout=args.window)
    h.keep_tmp = bool(watcher.stalled)  # the run's logs stay where a stall was caught
    verdict = f"STALL in {', '.join(watcher.stalled)}" if watcher.stalled else "no stall"
    return f"{verdict}; longest silence {silence:.1f} s, epoch changes {changes}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12)
    parser.add_argument("--window", type=float, default=40.0, help="seconds both workers train in a run")
    parser.add_argument("--join-after", type=float, default=8.0, help="B joins this long after A's first step")
    parser.add_argument("--stall", type=float, default=5.0, help="a worker silent this long is stalled")
    parser.add_argument("--load", type=int, default=0, help="background processes burning CPU in bursts")
    parser.add_argument("--efficiency", nargs=argparse.REMAINDER, default=None,
                        help="run bench/swarm_efficiency.py with these arguments under the watcher")  # fmt: skip
    args = parser.parse_args()

    dumps = Path(tempfile.mkdtemp(prefix="swarmhub-stall-hunt-"))
    os.environ["SWARMHUB_TASKDUMP_DIR"] = str(dumps)  # the harness's processes inherit os.environ
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TASKDUMP), os.environ.get("PYTHONPATH")]))
    print(f"stall_hunt: {c.machine_line()}; dumps in {dumps}")
    burners = [multiprocessing.Process(target=burn, args=(i,), daemon=True) for i in range(args.load)]
    for b in burners:
        b.start()
    load = c.MachineLoad()
    try:
        if args.efficiency is not None:
            import swarm_efficiency

            watchers: list[Watcher] = []
            enter = c.Harness.__enter__

            def watched_enter(h: c.Harness) -> c.Harness:
                watchers.append(Watcher(h, args.stall, dumps))
                return enter(h)

            c.Harness.__enter__ = watched_enter  # type: ignore[method-assign]
            os.environ["SWARMHUB_BENCH_KEEP"] = "1"  # every round's logs, stalled or not
            sys.argv = ["swarm_efficiency.py", *args.efficiency]
            code = swarm_efficiency.main()
            stalled = [name for w in watchers for name in w.stalled]
            print(f"stalls: {len(stalled)} ({', '.join(stalled) or 'none'})")
            return code
        target = c.sized_target(None, 2, 7.0, c.HIDDEN_SIZE, c.BATCH_SIZE)
        experiment = c.experiment_config(target_batch_size=target, matchmaking_time=3.0)
        stalls = 0
        for r in range(args.runs):
            with c.Harness("stall-hunt") as h:
                line = staggered_run(h, r, args, experiment)
                stalls += line.startswith("STALL")
                print(f"run {r + 1}/{args.runs}: {line}" + (f" (logs: {h.tmp})" if h.keep_tmp else ""), flush=True)
        print(f"stalls: {stalls} in {args.runs} runs; dumps in {dumps}" if stalls else f"stalls: 0 in {args.runs} runs")
        if not stalls:
            shutil.rmtree(dumps, ignore_errors=True)
    finally:
        for b in burners:
            b.terminate()
        print(load.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
