"""Credit: how much of what honest volunteers train the verified leaderboard credits, and what the server's peers cost.

A real ``swarmhub server`` (SQLite, its swarm peers on 127.0.0.1: monitor, witness, and the checkpoint peer of a
task that keeps them) and N real ``swarmhub join`` processes, each its own volunteer, training one experiment for
``--minutes``. Every 5 s the organizer's leaderboard is read (verified, pending and claimed samples per volunteer).

Printed per swarm size:
- verified/claimed per volunteer over the window ``[--skip, --skip + --window]`` minutes (the growth of each over
  the window; verified lags claims by an epoch or two, so a short window reads low), and over the whole run once the
  workers have left and the ledger has settled;
- the CPU the server's peer processes (and what they forked: DHT, averagers, p2pd) used over the window, in cores,
  and per active worker.

    python bench/credit.py [--task digits|albert-mlm] [--sizes 2,4,6] [--group-size 0] [--minutes 7] [--skip 1]
        [--window 5]

``--group-size N`` (N >= 2) splits each swarm into averaging groups of at most N volunteers' peers (the experiment's
``group_size``), each with a witness of its own; the server runs ``ceil(volunteers / N)`` witnesses.

Targets (issue "Every honest volunteer is credited"): verified/claimed >= 0.95 for each honest volunteer; the
server's peers <= 0.05 cores per active worker.
"""

from __future__ import annotations

import argparse
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Any

import _common as c
import _server as s

PEER_MODULES = ("bootstrap_peer", "aux_peer", "checkpoint_peer")
TARGET_RATIO, TARGET_CORES_PER_WORKER, TARGET_IDLE_CORES = 0.95, 0.05, 0.25
IDLE_SETTLE_SECONDS = 45
EXPERIMENTS: dict[str, dict[str, Any]] = {
    "digits": {
        "task": "digits",
        "task_params": {"hidden_size": 64, "batch_size": 32},
        "learning_rate": 0.003,
        "target_batch_size": 1024,
        "matchmaking_time": 2.0,
        "averaging_timeout": 20.0,
    },
    "albert-mlm": {
        "task": "albert-mlm",
        "task_params": {"size": "tiny", "batch_size": 16, "warmup_steps": 20, "total_steps": 5000},
        "optimizer": "lamb",
        "learning_rate": 0.01,
        "target_batch_size": 1024,
        "matchmaking_time": 2.0,
        "averaging_timeout": 20.0,
        "checkpoint_minutes": 1.0,
    },
}


def make_volunteers(database_url: str, count: int) -> list[tuple[str, str]]:
    """``count`` volunteers with API tokens, made with the server's service functions: (username, token)."""
    from swarmhub.server.accounts import users as accounts
    from swarmhub.server.core.db import make_engine, make_sessionmaker

    engine = make_engine(database_url)
    made = []
    try:
        with make_sessionmaker(engine).begin() as session:
            for index in range(count):
                user = accounts.create_user(session, f"volunteer-{index + 1}", secrets.token_urlsafe(12))
                made.append((user.username, accounts.issue_token(session, user, "bench worker")[0]))
    finally:
        engine.dispose()
    return made


def board(server: s.SwarmhubServer, slug: str) -> dict[str, tuple[int, int, int]]:
    rows = server.http.get(f"/api/experiments/{slug}/leaderboard").json()
    return {r["username"]: (r["samples"], r["pending_samples"], r["claimed_samples"]) for r in rows}


def run_size(task: str, size: int, args: argparse.Namespace) -> dict[str, Any]:
    with c.Harness(f"credit-{size}") as h:
        database_url = f"sqlite:///{h.tmp / 'credit.db'}"
        server = s.SwarmhubServer(h, "server", database_url, swarm=True)
        slug = f"credit-{size}"
        experiment = {**EXPERIMENTS[task], "group_size": args.group_size}
        if args.target_batch:
            experiment["target_batch_size"] = args.target_batch
        created = server.http.post("/api/experiments", json={"slug": slug, "title": "Credit", **experiment})
        if created.status_code != 201:
            raise c.BenchError(created.text)
        if task == "albert-mlm":
            from swarmhub.server.corpus import text as corpus

            text = corpus.builtin_text("python-docstrings", max_bytes=2_000_000).encode()
            uploaded = server.http.put(
                f"/api/experiments/{slug}/corpus",
                files={"file": ("text.txt", text)},
                data={"vocab_size": "4000", "seq_length": "64"},
                timeout=300,
            )
            if uploaded.status_code != 200:
                raise c.BenchError(uploaded.text)
        server.http.post(f"/api/experiments/{slug}/status", json={"action": "start"}).raise_for_status()
        volunteers = make_volunteers(database_url, size)
        idle = measure_idle(server, args.idle_minutes) if args.idle_minutes > 0 else None
        workers = []
        for name, token in volunteers:
            env = h.env(
                SWARMHUB_SERVER=server.url,
                SWARMHUB_TOKEN=token,
                SWARMHUB_CONFIG_DIR=str(h.tmp / name),
                SWARMHUB_STATE_DIR=str(h.tmp / name),
                SWARMHUB_CACHE_DIR=str(h.tmp / name / "cache"),
            )
            argv = [*s.SWARMHUB_CLI, "join", slug, "--listen", "/ip4/127.0.0.1/tcp/0"]
            workers.append(h.spawn(name, argv, env=env, stop_signal=signal.SIGINT))
        started = time.monotonic()
        window = (started + args.skip * 60, started + (args.skip + args.window) * 60)
        readings: list[tuple[float, dict[str, tuple[int, int, int]]]] = []
        cpu: dict[str, float] = {}
        while time.monotonic() < started + args.minutes * 60:
            now = time.monotonic()
            if "start" not in cpu and now >= window[0]:
                cpu["start"], cpu["t0"] = server.monitor_seconds(PEER_MODULES), now
            if "end" not in cpu and now >= window[1]:
                cpu["end"], cpu["t1"] = server.monitor_seconds(PEER_MODULES), now
            readings.append((now, board(server, slug)))
            for w in workers:
                if w.popen.poll() is not None:
                    raise c.BenchError(f"{w.name} exited: {w.log_tail()}")
            time.sleep(5)
        if "end" not in cpu:
            cpu["end"], cpu["t1"] = server.monitor_seconds(PEER_MODULES), time.monotonic()
        h.stop(workers, timeout=90)
        time.sleep(15)  # the monitor reads the last records and the witness's last rounds
        final = board(server, slug)

    def at(t: float) -> dict[str, tuple[int, int, int]]:
        return min(readings, key=lambda r: abs(r[0] - t))[1]

    first, last = at(window[0]), at(window[1])
    ratios, whole = {}, {}
    for name, _ in volunteers:
        v0, _, c0 = first.get(name, (0, 0, 0))
        v1, _, c1 = last.get(name, (0, 0, 0))
        ratios[name] = (v1 - v0) / (c1 - c0) if c1 > c0 else 0.0
        vf, _, cf = final.get(name, (0, 0, 0))
        whole[name] = vf / cf if cf else 0.0
    cores = (cpu["end"] - cpu.get("start", 0.0)) / max(cpu["t1"] - cpu.get("t0", started), 1e-9)
    return {"size": size, "window": ratios, "whole": whole, "cores": cores, "idle": idle, "final": final}


def measure_idle(server: s.SwarmhubServer, minutes: float) -> float:
    """Cores the running experiment's server peers use with no volunteer: once the monitor and the witness are up
    and ``IDLE_SETTLE_SECONDS`` have passed (their start-up is not idle), over ``minutes``."""
    deadline = time.monotonic() + 240
    while not {"bootstrap_peer", "aux_peer"} <= {m for m, _ in server.peer_processes(PEER_MODULES)}:
        if time.monotonic() > deadline:
            raise c.BenchError("the server's swarm peers did not start within 4 minutes")
        time.sleep(2)
    time.sleep(IDLE_SETTLE_SECONDS)
    start, t0 = server.monitor_seconds(PEER_MODULES), time.monotonic()
    time.sleep(minutes * 60)
    return (server.monitor_seconds(PEER_MODULES) - start) / (time.monotonic() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="digits", choices=sorted(EXPERIMENTS))
    parser.add_argument("--sizes", default="2,4,6")
    parser.add_argument("--group-size", type=int, default=0, help="volunteers' peers per averaging group (0: one)")
    parser.add_argument("--target-batch", type=int, default=0, help="the experiment's target batch size (0: 1,024)")
    parser.add_argument(
        "--idle-minutes", type=float, default=1.0, help="minutes the running experiment is measured with no volunteer"
    )
    parser.add_argument("--minutes", type=float, default=7.0)
    parser.add_argument("--skip", type=float, default=1.0, help="minutes before the measured window")
    parser.add_argument("--window", type=float, default=5.0, help="minutes of the measured window")
    args = parser.parse_args()
    if args.skip + args.window > args.minutes:
        parser.error("--skip + --window must fit in --minutes")
    print(c.machine_line(), flush=True)
    rows = []
    with s.bench_lock():
        for size in [int(x) for x in args.sizes.split(",")]:
            result = run_size(args.task, size, args)
            worst = min(result["window"].values())
            worst_whole = min(result["whole"].values())
            per_worker = result["cores"] / size
            idle = result["idle"]
            # What each active worker adds to the server's peers beyond what the running experiment costs idle:
            # the issue budgets the two apart (<= 0.25 cores idle, <= 0.05 a worker), so both are printed.
            marginal = (result["cores"] - idle) / size if idle is not None else None
            print(
                f"{args.task}, {size} volunteers, group size {args.group_size}, target batch "
                f"{args.target_batch or 1024}: verified/claimed in the window "
                f"{', '.join(f'{n} {r:.3f}' for n, r in sorted(result['window'].items()))}; whole run "
                f"{', '.join(f'{n} {r:.3f}' for n, r in sorted(result['whole'].items()))}; server peers "
                f"{result['cores']:.3f} cores ({per_worker:.3f} a worker"
                + (f", {marginal:.3f} a worker above idle; idle {idle:.3f} cores" if idle is not None else "")
                + f"); final {result['final']}",
                flush=True,
            )
            added = marginal if marginal is not None else per_worker
            passed = worst >= TARGET_RATIO and added <= TARGET_CORES_PER_WORKER
            passed = passed and (idle is None or idle <= TARGET_IDLE_CORES)
            rows.append(
                [
                    size,
                    f"{worst:.3f}",
                    f"{worst_whole:.3f}",
                    f"{idle:.3f}" if idle is not None else "-",
                    f"{result['cores']:.3f}",
                    f"{per_worker:.3f}",
                    f"{marginal:.3f}" if marginal is not None else "-",
                    c.verdict(passed),
                ]
            )
    print(
        c.table(
            [
                "volunteers",
                "lowest verified/claimed (window)",
                "lowest (whole run)",
                "idle experiment, cores",
                "server peers, cores",
                "cores a worker",
                "a worker above idle",
                f"target >= {TARGET_RATIO}; idle <= {TARGET_IDLE_CORES}; above idle <= {TARGET_CORES_PER_WORKER}",
            ],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
