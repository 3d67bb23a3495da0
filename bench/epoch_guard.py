"""The epoch-length guard: is it still needed? Swarms with and without it, at epochs shorter than matchmaking_time.

swarmhub's training loop waits, after each epoch change, until ``matchmaking_time`` has passed since the last one
(``worker/training/loop.py`` ``trainer_loop``, ``min_epoch_seconds``). It was added because hivemind 1.1.12's
matchmaking wedged for good ("aclose(): asynchronous generator is already running", then every round "could not find a
group") when rounds were cancelled as fast as they were scheduled. It also caps a swarm at ``target_batch_size /
matchmaking_time`` samples/s. Since then the optimizer no longer pre-schedules a round while it sees no other peer
(``worker/training/optimizer.py``) and the global batch no longer overshoots. This benchmark runs the same swarms with
the guard (as shipped) and without it (the worker process's ``"epoch_guard": false``), at a target batch that two
workers of this machine compute in ``--epoch-seconds`` (default 0.5 s, against a ``matchmaking_time`` of 2 s):

- **pair**: the server's bootstrap/monitor peer and two workers started at the same moment (the start that once
  wedged: both see no one, then each other). Window: ``window`` seconds from the second worker's first step;
- **alone**: the server's peer and one worker (a swarm of one: every epoch change is immediate without the guard);
- **alone + witness**: one worker joined through a real ``swarmhub server`` (``swarmhub join``'s path, the
  experiment's default ``aux_peer``): the server's witness averages with it every epoch, as in production.

Per variant and scenario it prints: samples/s of the swarm, epochs and mean epoch length, epoch changes that came
after averaging with both peers, averaging rounds with 2 peers in the window's last third (matchmaking still
alive at the end), lines in the workers' logs that report a failed round or the wedge ("aclose()"), and the cores
the server's peer used (it receives every progress record: one at least at every epoch end).

Command: ``.venv/bin/python bench/epoch_guard.py [--quick]`` (full: 2 rounds, variant order flipped in round 2,
about 8 minutes on 2 cores; --quick: 1 round with shorter windows). Exits 0 whatever it measures; nonzero only
when the benchmark itself fails. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import _common as c
from _server import SwarmhubServer

MATCHMAKING_TIME = 2.0
AVERAGING_TIMEOUT = 10.0
HIDDEN_SIZE = 1024
BATCH_SIZE = 128

# What a worker's log says when a round failed, and the wedge itself
FAILED = re.compile(r"could not find a group|did not finish|Failed to|Traceback|caught .*retrying", re.IGNORECASE)
WEDGE = "aclose(): asynchronous generator is already running"


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    window: float
    alone_window: float


# (name, workers, window, through the server): the server's witness averages with a worker alone every epoch
SCENARIOS = (("pair", 2, "window", False), ("alone", 1, "alone", False), ("alone + witness", 1, "window", True))

FULL = Mode("full", rounds=2, window=40.0, alone_window=20.0)
QUICK = Mode("quick", rounds=1, window=15.0, alone_window=8.0)

TARGET_BATCH_SIZE = 0  # sized in main()
OVERLAP: str | None = None  # --overlap: the experiment's overlap setting


def experiment() -> dict[str, Any]:
    return c.experiment_config(
        hidden_size=HIDDEN_SIZE,
        batch_size=BATCH_SIZE,
        target_batch_size=TARGET_BATCH_SIZE,
        matchmaking_time=MATCHMAKING_TIME,
        averaging_timeout=AVERAGING_TIMEOUT,
        overlap=OVERLAP,
    )


def log_counts(proc: c.Proc, size: int) -> tuple[int, int]:
    """Failed-round lines and wedge messages in the first ``size`` bytes of the worker's log (what it wrote before
    it was asked to stop: hivemind's shutdown prints tracebacks of its own that say nothing about the rounds)."""
    with open(proc.log, "rb") as f:
        text = f.read(size).decode(errors="replace")
    return sum(1 for line in text.splitlines() if FAILED.search(line)), text.count(WEDGE)


def run(
    h: c.Harness, r: int, guard: bool, workers: int, window: float, server: SwarmhubServer | None = None
) -> dict[str, Any]:
    """``workers`` workers in a new swarm: with the bench's swarm peer (bootstrap/monitor, no witness), or joined
    through ``server`` (``swarmhub join``'s path: the server's monitor peer and its witness)."""
    tag = f"r{r}-{'guard' if guard else 'noguard'}-{workers}{'-server' if server else ''}"
    exp = experiment()
    procs = []
    if server is None:
        peer = h.swarm_peer(f"{tag}-peer")
        watched = [peer.proc]
        for name in "AB"[:workers]:
            identity = h.tmp / f"{tag}-{name}.key"
            join = c.join_json(peer, f"worker-{tag}-{name}", identity, exp)
            config: dict[str, Any] = {"join": join, "identity": str(identity), "epoch_guard": guard}
            procs.append(h.worker(f"{tag}-{name}", "swarmhub", config))
    else:
        slug = server.start_experiment(experiment=exp)
        watched = [server.proc]
        for name in "AB"[:workers]:
            state = h.tmp / f"{tag}-{name}-state"
            state.mkdir()
            config = {"url": server.url, "token": server.token, "slug": slug, "state_dir": str(state)}
            procs.append(h.worker(f"{tag}-{name}", "server", {**config, "epoch_guard": guard}))
    t0 = c.wait_progress(procs, 180)
    cpu0 = c.cpu_seconds(watched)
    c.sleep_until(t0 + window)
    t1 = time.time()
    server_cpu = c.cpu_share(cpu0, c.cpu_seconds(watched), t1 - t0)
    sizes = [p.log.stat().st_size for p in procs]
    codes = h.stop([*procs, *watched] if server is None else procs, timeout=AVERAGING_TIMEOUT + 5)
    if server is not None:
        server.finish(slug)
    if any(code not in (0, None) for code in codes):
        raise c.BenchError(f"{tag}: exit codes {codes}\n{procs[0].log_tail()}")
    samples = sum(c.samples_at(p.events, t1) - c.samples_at(p.events, t0) for p in procs)
    changes = [e for p in procs for e in c.progress(p.events) if e.get("epoch_change") and t0 <= e["t"] <= t1]
    epochs = sorted({e["epoch"] for e in changes})
    last_third = t1 - window / 3
    late_pairs = sum(1 for e in changes if e["t"] >= last_third and e.get("averaged_peers") == 2)
    failed, wedged = zip(*(log_counts(p, size) for p, size in zip(procs, sizes, strict=True)), strict=True)
    return {
        "rate": samples / (t1 - t0),
        "epochs": len(epochs),
        "epoch_s": window / len(epochs) if epochs else float("nan"),
        "averaged": f"{sum(1 for e in changes if e.get('averaged_peers') == 2)}/{len(changes)}",
        "late_pairs": late_pairs,
        "failed": sum(failed),
        "wedged": sum(wedged),
        "server_cpu": server_cpu,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    parser.add_argument(
        "--epoch-seconds",
        type=float,
        default=0.5,
        help="the target batch is what two workers of this machine compute in this time (default 0.5 s)",
    )
    parser.add_argument("--target-batch-size", type=int, default=None, help="the experiment's target batch size")
    c.add_overlap_option(parser, "the experiment's overlap setting (default: the experiment default, none)")
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    rounds = args.rounds or mode.rounds
    print(f"epoch_guard ({mode.name}): {c.machine_line()}")
    global TARGET_BATCH_SIZE, OVERLAP
    OVERLAP = args.overlap
    TARGET_BATCH_SIZE = c.sized_target(args.target_batch_size, 2, args.epoch_seconds, HIDDEN_SIZE, BATCH_SIZE)
    cap = TARGET_BATCH_SIZE / MATCHMAKING_TIME
    print(
        f"workload: digits MLP hidden_size={HIDDEN_SIZE}, batch {BATCH_SIZE}/step, target_batch_size "
        f"{TARGET_BATCH_SIZE:,} (~{args.epoch_seconds} s of compute for 2 workers), matchmaking_time "
        f"{MATCHMAKING_TIME} s (the guard caps a swarm at {cap:,.0f} samples/s), averaging_timeout "
        f"{AVERAGING_TIMEOUT} s, overlap {OVERLAP or 'none (default)'}; one thread per worker; {rounds} round(s)"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    results: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    with c.Harness("epoch-guard") as h:
        server = SwarmhubServer(h, "server", f"sqlite:///{h.tmp / 'server.db'}", swarm=True)
        try:
            for r in range(rounds):
                order = [True, False] if r % 2 == 0 else [False, True]
                for scenario, workers, window, via in SCENARIOS:
                    for guard in order:
                        with c.phase(f"round {r + 1}/{rounds}: {scenario}, {'guard' if guard else 'no guard'}"):
                            wait = mode.window if window == "window" else mode.alone_window
                            x = run(h, r, guard, workers, wait, server if via else None)
                            results.setdefault((scenario, guard), []).append(x)
        finally:
            server.close()
        h.stop([server.proc], timeout=60)
        cleanup = h.check_no_leftovers()
    print()
    print(f"results ({rounds} round(s), {time.monotonic() - started:.0f} s; one row per round):")
    rows = []
    for (scenario, guard), runs in results.items():
        for i, x in enumerate(runs):
            rows.append(
                [
                    f"{scenario}, {'guard' if guard else 'no guard'}",
                    i + 1,
                    f"{x['rate']:,.0f}",
                    x["epochs"],
                    f"{x['epoch_s']:.2f}",
                    x["averaged"] if scenario != "alone" else "-",
                    x["late_pairs"] if scenario != "alone" else "-",
                    x["failed"],
                    x["wedged"],
                    x["server_cpu"],
                ]
            )
    headers = ["variant", "round", "samples/s", "epochs", "s/epoch", "after 2-peer avg", "late 2-peer", "failed",
               "wedge", "server's peers, cores"]  # fmt: skip
    print(c.table(headers, rows))
    for scenario, *_ in SCENARIOS:
        on = c.median([x["rate"] for x in results[(scenario, True)]])
        off = c.median([x["rate"] for x in results[(scenario, False)]])
        print(f"{scenario}: samples/s without the guard / with it = {off / on:.2f} (median over rounds)")
    wedged = sum(x["wedged"] for runs in results.values() for x in runs)
    dead = [i + 1 for i, x in enumerate(results[("pair", False)]) if x["late_pairs"] == 0]  # no 2-peer round at the end
    print(
        f"without the guard: wedge messages {wedged}; pair rounds whose last third had no 2-peer average: "
        f"{dead or 'none'}"
    )
    print(cleanup)
    print(load.line())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, KeyboardInterrupt) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
