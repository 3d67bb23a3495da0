"""Metric ingestion: reports stored per second by ``swarmhub server`` over its report websockets, 200 workers at
once, against a bare Starlette websocket endpoint that only parses JSON, served by uvicorn the same way.

What it measures:

- swarmhub: a real ``swarmhub server`` (SWARMHUB_SWARM_ENABLED=false), once on SQLite (the default, a temp file)
  and once on PostgreSQL (a throw-away database on 127.0.0.1:5432). 200 simulated workers, each with its own
  worker run and its volunteer's API token, each on its own authenticated websocket to
  ``/ws/experiments/{slug}/report?worker_id=...``, send valid ``MetricReport`` messages with increasing ``seq``
  and by default wait for each ``Ack`` before the next (one report in flight per worker, as the real reporter
  has at its pace); with ``--in-flight N`` each keeps up to N unacknowledged, as the reporter does with a
  backlog (acks are cumulative); an ack means the report is committed to the database (counted again in the
  database at the end);
- bare: the same clients against a Starlette endpoint that does ``json.loads`` and answers
  ``{"type":"ack","seq":N}`` (the same bytes as swarmhub's ack), under ``uvicorn.run`` with the same options
  (uvloop, httptools, websockets, ``ws_max_size``).

The server closes a report socket that sends more than 50 messages in a second (``MAX_MESSAGES_PER_SECOND`` in
``server/routes/ws.py``, a constant, no setting); real workers send one report every 1-2 s. So each simulated
worker sends at most ``--rate`` (45) messages a second, just under the limit: 200 workers offer at most 9,000
messages/s. "saturated" = the rate each server absorbs at that offer (it is the server, not the limit, that
bounds swarmhub); ratio = swarmhub / bare, target >= 0.5. A second measurement, "real pace", has the 200 workers
send one report a second each (what 200 real volunteers send) and reports the server's CPU and the ack latency.

The load comes from two client processes (100 workers each, asyncio + ``websockets``); the table shows their
CPU: on this 2-core machine they share the cores with the server, which caps the bare endpoint's figure (and so
flatters the ratio; see docs/benchmarks/server.md). Rounds alternate the variants (order rotated each round).

Command: ``.venv/bin/python bench/ingestion.py [--quick] [--no-postgres] [--in-flight N]`` (full: 3 rounds,
about 4 minutes; --quick: 1 short round, about a minute). Exits 0 whether the target is met or not; nonzero only
when the benchmark itself fails. Leaves no process (and no database) behind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import _server as s
import httpx

TARGET = 0.5
CLIENTS = 2


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    workers: int
    warmup: float
    window: float
    real_window: float


FULL = Mode("full", rounds=3, workers=200, warmup=3.0, window=10.0, real_window=15.0)
QUICK = Mode("quick", rounds=1, workers=200, warmup=2.0, window=4.0, real_window=5.0)


# -- client process ------------------------------------------------------------------------------------------


async def _worker(ws_url: str, path: str, worker_id: str, token: str, cfg: dict[str, Any], out: dict[str, Any]) -> None:
    """Sends reports at most ``rate`` a second with at most ``in_flight`` unacknowledged (1: wait for each ack
    before the next), and at the end waits for the acks of all it sent."""
    from websockets.asyncio.client import connect

    interval = 1.0 / cfg["rate"]
    seq = cfg["seq_base"]
    sent_at: dict[int, float] = {}
    room = asyncio.Semaphore(cfg["in_flight"])
    async with connect(
        f"{ws_url}{path}?worker_id={worker_id}",
        additional_headers={"Authorization": f"Bearer {token}"},
        open_timeout=60,
        max_size=2**20,
        compression=None,
    ) as ws:
        out["connected"] += 1

        async def receive_acks() -> None:
            while True:
                raw = await ws.recv()
                if '"ack"' not in raw:
                    continue
                acked_seq = json.loads(raw)["seq"]
                acked = time.time()
                for done in [q for q in sent_at if q <= acked_seq]:  # acks are cumulative
                    sent = sent_at.pop(done)
                    room.release()
                    out["acked"] += 1
                    if window_start <= acked < window_end:
                        out["in_window"] += 1
                        out["latencies"].append(acked - sent)

        await asyncio.sleep(max(cfg["start_at"] - time.time(), 0) + (hash(worker_id) % 1000) / 1000 * interval)
        window_start, window_end, stop = cfg["window_start"], cfg["window_end"], cfg["stop_at"]
        receiver = asyncio.create_task(receive_acks())
        try:
            next_send = time.time()
            while True:
                now = time.time()
                if now >= stop:
                    break
                if next_send > now:
                    await asyncio.sleep(next_send - now)
                await room.acquire()
                if receiver.done():
                    receiver.result()  # raises what ended it
                sent = time.time()
                next_send = sent + interval
                sent_at[seq] = sent
                await ws.send(s.report_message(seq))
                seq += 1

            async def all_acknowledged() -> None:
                for _ in range(cfg["in_flight"]):
                    await room.acquire()

            try:
                await asyncio.wait_for(all_acknowledged(), 30)
            except asyncio.TimeoutError:
                raise RuntimeError(f"{len(sent_at)} report(s) never acknowledged") from None
        finally:
            receiver.cancel()


async def _client_main(cfg: dict[str, Any]) -> None:
    out: dict[str, Any] = {"connected": 0, "acked": 0, "in_window": 0, "latencies": [], "errors": []}

    async def one(worker_id: str, token: str) -> None:
        try:
            await _worker(cfg["ws_url"], cfg["path"], worker_id, token, cfg, out)
        except Exception as exc:  # reported, and the benchmark fails on it
            out["errors"].append(f"{type(exc).__name__}: {exc}"[:200])

    tasks = [asyncio.create_task(one(w, t)) for w, t in cfg["workers"]]
    await asyncio.sleep(max(cfg["start_at"] - time.time(), 0))
    s.emit(event="connected", connected=out["connected"], errors=len(out["errors"]))
    await asyncio.sleep(max(cfg["window_start"] - time.time(), 0))
    cpu0 = _cpu()
    await asyncio.sleep(max(cfg["window_end"] - time.time(), 0))
    cpu = (_cpu() - cpu0) / (cfg["window_end"] - cfg["window_start"])
    await asyncio.gather(*tasks)
    lat = out["latencies"]
    s.emit(
        event="result",
        connected=out["connected"],
        acked=out["acked"],
        in_window=out["in_window"],
        cpu=cpu,
        p50=s.percentile(lat, 50),
        p99=s.percentile(lat, 99),
        errors=out["errors"][:5],
        error_count=len(out["errors"]),
    )


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def client(config_path: str) -> None:
    s.raise_open_files()
    cfg = json.loads(Path(config_path).read_text())
    try:
        import uvloop

        uvloop.run(_client_main(cfg))
    except ImportError:
        asyncio.run(_client_main(cfg))


# -- orchestration -------------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    ws_url: str
    pid: int
    slug: str
    workers: list[tuple[str, str]]
    database_url: str | None  # None: the bare endpoint (stores nothing)
    seq_base: int = 0


def measure(
    h: c.Harness, t: Target, tag: str, rate: float, warmup: float, window: float, in_flight: int
) -> dict[str, Any]:
    """One measurement: CLIENTS client processes drive ``t``'s workers at ``rate`` messages/s each."""
    start_at = time.time() + 6.0  # time to connect 200 websockets
    cfg_common = {
        "ws_url": t.ws_url,
        "path": f"/ws/experiments/{t.slug}/report",
        "rate": rate,
        "in_flight": in_flight,
        "seq_base": t.seq_base,
        "start_at": start_at,
        "window_start": start_at + warmup,
        "window_end": start_at + warmup + window,
        "stop_at": start_at + warmup + window + 0.5,
    }
    procs = []
    for i in range(CLIENTS):
        path = h.tmp / f"{tag}-client{i}.json"
        path.write_text(json.dumps({**cfg_common, "workers": t.workers[i::CLIENTS]}))
        procs.append(h.spawn(f"{tag}-client{i}", [sys.executable, os.path.abspath(__file__), "--client", str(path)]))
    stored0 = s.stored_reports(t.database_url, t.slug) if t.database_url else 0
    c.sleep_until(start_at + warmup)
    cpu0 = s.cpu_seconds(t.pid)
    c.sleep_until(start_at + warmup + window)
    server_cpu = (s.cpu_seconds(t.pid) - cpu0) / window
    results = []
    for p in procs:
        try:
            results.append(p.reader.wait_for("result", 60))
        except c.BenchError as exc:
            raise c.BenchError(f"{exc}\n{p.log_tail()}") from None
    h.stop(procs)
    errors = sum(r["error_count"] for r in results)
    if errors:
        raise c.BenchError(f"{t.name}: {errors} worker connection(s) failed: {results[0]['errors']}")
    acked = sum(r["acked"] for r in results)
    t.seq_base += acked + 1_000_000  # every worker's seq keeps increasing in the next measurement
    stored = None
    if t.database_url:
        stored = s.stored_reports(t.database_url, t.slug) - stored0
        if stored != acked:
            raise c.BenchError(f"{t.name}: {acked} reports acknowledged but {stored} stored")
    return {
        "rate": sum(r["in_window"] for r in results) / window,
        "connected": sum(r["connected"] for r in results),
        "server_cpu": server_cpu,
        "client_cpu": sum(r["cpu"] for r in results),
        "p50": max(r["p50"] for r in results),
        "p99": max(r["p99"] for r in results),
        "acked": acked,
        "stored": stored,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    parser.add_argument("--rate", type=float, default=45.0, help="most messages/s per worker (server limit: 50)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument(
        "--in-flight",
        type=int,
        default=1,
        help="most unacknowledged reports per worker when saturated (1: wait for each ack; the real reporter "
        "sends a backlog without waiting)",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client(args.client)
        return 0
    mode = QUICK if args.quick else FULL
    rounds = args.rounds or mode.rounds
    s.raise_open_files()
    with s.bench_lock():
        return run(mode, rounds, args.rate, not args.no_postgres, args.in_flight)


def run(mode: Mode, rounds: int, rate: float, postgres: bool, in_flight: int) -> int:
    print(f"ingestion ({mode.name}): {c.machine_line()}")
    print(
        f"workload: {mode.workers} workers (own websocket, worker run and volunteer token each), "
        f"{CLIENTS} client processes; saturated: at most {rate:g} messages/s per worker (server limit 50) and "
        f"{in_flight} unacknowledged, "
        f"warm-up {mode.warmup:g} s, window {mode.window:g} s, {rounds} round(s); real pace: 1 message/s per "
        f"worker, window {mode.real_window:g} s"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    saturated: dict[str, list[dict[str, Any]]] = {}
    real: dict[str, dict[str, Any]] = {}
    with c.Harness("ingestion") as h:
        with contextlib.ExitStack() as stack:
            targets = []
            with c.phase("starting the bare endpoint and swarmhub server(s)"):
                bare = s.BareServer(h)
                targets.append(
                    Target("bare", bare.ws_url, bare.pid, "bare", [(f"w{i}", "-") for i in range(mode.workers)], None)
                )
                dbs = [("sqlite", f"sqlite:///{h.tmp / 'server.db'}")]
                if postgres:
                    dbs.append(("postgresql", stack.enter_context(s.postgres_database("ingest"))))
                for name, url in dbs:
                    server = s.SwarmhubServer(h, f"swarmhub-{name}", url)
                    stack.callback(server.close)
                    slug = server.start_experiment("ingest")
                    workers = s.volunteers(url, slug, mode.workers)
                    targets.append(Target(f"swarmhub ({name})", server.ws_url, server.pid, slug, workers, url))
            for r in range(rounds):
                order = targets[r % len(targets) :] + targets[: r % len(targets)]
                for t in order:
                    with c.phase(f"round {r + 1}/{rounds}: {t.name}, saturated"):
                        saturated.setdefault(t.name, []).append(
                            measure(h, t, f"r{r}-{t.name[:12]}", rate, mode.warmup, mode.window, in_flight)
                        )
            for t in targets:
                with c.phase(f"real pace: {t.name}"):
                    real[t.name] = measure(h, t, f"real-{t.name[:12]}", 1.0, mode.warmup, mode.real_window, 1)
            h.stop([p for p in h.procs if p.popen.poll() is None], timeout=30)
        cleanup = h.check_no_leftovers()
    report(saturated, real, rounds, rate, mode, time.monotonic() - started)
    print(cleanup)
    print(load.line())
    return 0


def report(
    saturated: dict[str, list[dict[str, Any]]],
    real: dict[str, dict[str, Any]],
    rounds: int,
    rate: float,
    mode: Mode,
    elapsed: float,
) -> None:
    bare = [m["rate"] for m in saturated["bare"]]
    print()
    print(
        f"saturated ({rounds} round(s), {elapsed:.0f} s in all; messages/s acknowledged, i.e. stored, in the "
        f"window; offer at most {mode.workers} x {rate:g} = {mode.workers * rate:,.0f}/s; median and min..max):"
    )
    headers = [
        "variant",
        *[f"round {i + 1}" for i in range(rounds)],
        "median",
        "spread",
        "server cores",
        "client cores",
        "ack p50 ms",
        "ack p99 ms",
    ]
    rows = []
    ratios: dict[str, list[float]] = {}
    for name, ms in saturated.items():
        rates = [m["rate"] for m in ms]
        rows.append(
            [
                name,
                *rates,
                c.median(rates),
                c.spread(rates),
                c.median([m["server_cpu"] for m in ms]),
                c.median([m["client_cpu"] for m in ms]),
                c.median([m["p50"] * 1000 for m in ms]),
                c.median([m["p99"] * 1000 for m in ms]),
            ]
        )
        if name != "bare":
            ratios[name] = [m["rate"] / b for m, b in zip(ms, bare, strict=True)]
    for name, rs in ratios.items():
        rows.append([f"ratio {name}/bare", *rs, c.median(rs), c.spread(rs), "", "", "", ""])
    print(c.table(headers, rows))
    print()
    print(f"real pace ({mode.workers} workers x 1 message/s, one window of {mode.real_window:g} s):")
    rows = [
        [name, m["rate"], m["server_cpu"], m["client_cpu"], m["p50"] * 1000, m["p99"] * 1000]
        for name, m in real.items()
    ]
    print(c.table(["variant", "messages/s", "server cores", "client cores", "ack p50 ms", "ack p99 ms"], rows))
    stored = {
        name: sum(m["stored"] or 0 for m in ms) + (real[name]["stored"] or 0)
        for name, ms in saturated.items()
        if name != "bare"
    }
    print(f"every acknowledged report was found in the database (rows counted per measurement): {stored}")
    for name, rs in ratios.items():
        med = c.median(rs)
        print(f"{name}/bare = {med:.3f} (target >= {TARGET}): {c.verdict(med >= TARGET)}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, KeyboardInterrupt, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
