"""Server memory: resident set size (RSS) of ``swarmhub server`` with 1,000 connected workers, against the same
server idle.

What it measures: a real ``swarmhub server`` (SQLite, the default; SWARMHUB_SWARM_ENABLED=false, so the process
is the whole server: no hivemind peers), one running experiment. Each round starts the server afresh and samples
its RSS (``/proc`` through psutil, every 0.5 s):

- idle: after start-up and one HTTP request, before any worker connects;
- 1,000 workers: one client process (asyncio + ``websockets``) opens 1,000 authenticated report websockets
  (``/ws/experiments/{slug}/report?worker_id=...``; 1,000 worker runs of 100 volunteers, each volunteer with an API
  token), and each worker sends one valid ``MetricReport`` every 5 s (phases spread over the 5 s) and waits for its
  ack; the window starts once all are connected and have reported once;
- after: 5 s after every worker disconnected (what the process keeps).

Target: RSS with 1,000 workers <= 200 MB (median and max of the window). The open-files limit of the benchmark
(and so of the server and the client it starts) is raised to 20,000 with ``resource.setrlimit``.

Command: ``.venv/bin/python bench/memory.py [--quick]`` (full: 2 rounds, about 3 minutes; --quick: 1 short round).
Exits 0 whether the target is met or not; nonzero only when the benchmark itself fails. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import _server as s
import httpx
import psutil

TARGET_MB = 200.0
PERIOD = 5.0  # seconds between one worker's reports


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    workers: int
    idle: float
    window: float


FULL = Mode("full", rounds=2, workers=1000, idle=5.0, window=30.0)
QUICK = Mode("quick", rounds=1, workers=1000, idle=3.0, window=10.0)


# -- client process ------------------------------------------------------------------------------------------


async def _client_main(cfg: dict[str, Any]) -> None:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    gate = asyncio.Semaphore(100)
    counts = {"connected": 0, "reported": 0, "acked": 0}
    errors: list[str] = []
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, stop.set)
    everyone = asyncio.Event()
    n = len(cfg["workers"])

    async def worker(worker_id: str, token: str) -> None:
        try:
            async with gate:
                ws = await connect(
                    f"{cfg['url']}?worker_id={worker_id}",
                    additional_headers={"Authorization": f"Bearer {token}"},
                    open_timeout=120,
                    compression=None,
                )
            counts["connected"] += 1
            async with ws:
                seq = 0
                next_at = time.monotonic() + random.uniform(0, PERIOD)
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), max(next_at - time.monotonic(), 0))
                    if stop.is_set():
                        break
                    next_at += PERIOD
                    await ws.send(s.report_message(seq))
                    while True:
                        raw = await ws.recv()
                        if '"ack"' in raw and json.loads(raw).get("seq") == seq:
                            break
                    counts["acked"] += 1
                    if seq == 0:
                        counts["reported"] += 1
                        if counts["reported"] == n:
                            everyone.set()
                    seq += 1
        except ConnectionClosed as exc:
            errors.append(f"closed: {exc}"[:200])
        except Exception as exc:  # reported; the benchmark fails on it
            errors.append(f"{type(exc).__name__}: {exc}"[:200])
        finally:
            if errors and not everyone.is_set():
                everyone.set()  # let the benchmark see the failure

    tasks = [asyncio.create_task(worker(w, t)) for w, t in cfg["workers"]]
    await everyone.wait()
    s.emit(event="ready", **counts, errors=errors[:3], error_count=len(errors))
    await asyncio.gather(*tasks)
    s.emit(event="result", **counts, errors=errors[:3], error_count=len(errors))


def client(config_path: str) -> None:
    s.raise_open_files()
    asyncio.run(_client_main(json.loads(Path(config_path).read_text())))


# -- orchestration -------------------------------------------------------------------------------------------


def sample_rss(pid: int, seconds: float, every: float = 0.5) -> list[float]:
    """RSS of ``pid`` in MB, sampled for ``seconds``."""
    process = psutil.Process(pid)
    samples = []
    deadline = time.monotonic() + seconds
    while True:
        samples.append(process.memory_info().rss / 2**20)
        if time.monotonic() + every > deadline:
            return samples
        time.sleep(every)


def one_round(h: c.Harness, r: int, mode: Mode, database_url: str, first: bool) -> dict[str, Any]:
    server = s.SwarmhubServer(h, f"r{r}-server", database_url, admin=first)
    try:
        slug = server.start_experiment("memory")
        with c.phase(f"round {r + 1}: {mode.workers} worker runs"):
            workers = s.volunteers(database_url, slug, mode.workers, per_user=10)
        server.http.get(f"/api/experiments/{slug}")
        time.sleep(2.0)
        idle = sample_rss(server.pid, mode.idle)
        mapped = sum(
            m.rss for m in psutil.Process(server.pid).memory_maps() if "torch" in m.path or "hivemind" in m.path
        )
        path = h.tmp / f"r{r}-client.json"
        path.write_text(json.dumps({"url": f"{server.ws_url}/ws/experiments/{slug}/report", "workers": workers}))
        proc = h.spawn(f"r{r}-client", [sys.executable, os.path.abspath(__file__), "--client", str(path)])
        t_connect = time.monotonic()
        try:
            ready = proc.reader.wait_for("ready", 300)
        except c.BenchError as exc:
            raise c.BenchError(f"{exc}\n{proc.log_tail()}") from None
        connect_s = time.monotonic() - t_connect
        if ready["error_count"]:
            raise c.BenchError(f"{ready['error_count']} worker(s) failed: {ready['errors']}")
        cpu0 = s.cpu_seconds(server.pid)
        fds = psutil.Process(server.pid).num_fds()
        loaded = sample_rss(server.pid, mode.window)
        cpu = (s.cpu_seconds(server.pid) - cpu0) / mode.window
        os.kill(proc.popen.pid, signal.SIGUSR1)
        result = proc.reader.wait_for("result", 60)
        h.stop([proc])
        if result["error_count"]:
            raise c.BenchError(f"{result['error_count']} worker(s) failed: {result['errors']}")
        time.sleep(5.0)
        after = sample_rss(server.pid, 2.0)
        stored = s.stored_reports(database_url, slug)
        if stored != result["acked"]:
            raise c.BenchError(f"{result['acked']} reports acknowledged but {stored} stored")
        return {
            "idle": c.median(idle),
            "torch_mapped": mapped / 2**20,
            "loaded": c.median(loaded),
            "loaded_max": max(loaded),
            "after": c.median(after),
            "connected": ready["connected"],
            "acked": result["acked"],
            "stored": stored,
            "fds": fds,
            "cpu": cpu,
            "connect_s": connect_s,
        }
    finally:
        server.close()
        h.stop([server.proc], timeout=30)


def import_cost() -> tuple[float, float]:
    """RSS (MB) of a fresh Python after ``import torch, hivemind``, and after the web stack alone (FastAPI,
    SQLAlchemy, uvicorn, websockets, psycopg, redis, jinja2, alembic): what the server's imports weigh."""
    code = (
        "import psutil, sys\n"
        "if sys.argv[1] == 'torch':\n    import torch, hivemind\n"
        "else:\n    import fastapi, sqlalchemy, uvicorn, websockets, psycopg, redis, jinja2, alembic, httpx\n"
        "print(psutil.Process().memory_info().rss / 2**20)"
    )
    out = []
    for what in ("torch", "web"):
        done = subprocess.run([sys.executable, "-c", code, what], capture_output=True, text=True, timeout=120)
        out.append(float(done.stdout.strip() or "nan"))
    return out[0], out[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args.client)
        return 0
    mode = QUICK if args.quick else FULL
    limit = s.raise_open_files()
    with s.bench_lock():
        return run(mode, args.rounds or mode.rounds, limit)


def run(mode: Mode, rounds: int, limit: int) -> int:
    print(f"memory ({mode.name}): {c.machine_line()}")
    print(
        f"workload: {mode.workers} report websockets (one client process), one report every {PERIOD:g} s each, "
        f"RSS sampled every 0.5 s: idle {mode.idle:g} s, loaded {mode.window:g} s; {rounds} round(s), a fresh "
        f"server each; open-files limit {limit}"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    results = []
    with c.Harness("memory") as h:
        url = f"sqlite:///{h.tmp / 'server.db'}"
        for r in range(rounds):
            with c.phase(f"round {r + 1}/{rounds}"):
                results.append(one_round(h, r, mode, url, first=r == 0))
        cleanup = h.check_no_leftovers()
    torch_mb, web_mb = import_cost()
    report(results, rounds, mode, time.monotonic() - started)
    torch_mapped = c.median([r["torch_mapped"] for r in results])
    print(
        f"torch's and hivemind's shared libraries in the server's RSS: {torch_mapped:.0f} MB (0 when the server "
        f"imports neither, as it should: tests/test_server_imports.py). A fresh Python holds {torch_mb:.0f} MB "
        f"after `import torch, hivemind`, {web_mb:.0f} MB after the web stack alone"
    )
    print(cleanup)
    print(load.line())
    return 0


def report(results: list[dict[str, Any]], rounds: int, mode: Mode, elapsed: float) -> None:
    print()
    print(f"results ({rounds} round(s), {elapsed:.0f} s in all; server RSS in MB, median of each phase's samples):")
    headers = ["phase", *[f"round {i + 1}" for i in range(rounds)], "median", "spread"]

    def row(name: str, key: str) -> list[Any]:
        values = [r[key] for r in results]
        return [name, *values, c.median(values), c.spread(values)]

    growth = [(r["loaded"] - r["idle"]) * 1024 / mode.workers for r in results]
    rows = [
        row("idle", "idle"),
        row(f"{mode.workers} workers (median)", "loaded"),
        row(f"{mode.workers} workers (max)", "loaded_max"),
        row("after they left", "after"),
        ["KB per connected worker", *growth, c.median(growth), c.spread(growth)],
    ]
    print(c.table(headers, rows))
    for i, r in enumerate(results):
        print(
            f"round {i + 1}: {r['connected']} connected in {r['connect_s']:.0f} s, server open fds {r['fds']}, "
            f"server {r['cpu']:.2f} cores while loaded, {r['acked']} reports acknowledged, all found in the database"
        )
    worst = c.median([r["loaded_max"] for r in results])
    verdict = c.verdict(worst <= TARGET_MB)
    print(f"RSS with {mode.workers} workers: max {worst:.0f} MB (target <= {TARGET_MB:.0f} MB): {verdict}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, KeyboardInterrupt, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
