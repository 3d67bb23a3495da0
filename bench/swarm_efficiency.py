"""Swarm efficiency: two swarmhub workers training together against the sum of their solo throughputs, and
against the same two-peer swarm written as a plain ``hivemind.Optimizer`` loop.

What it measures (samples/s over a steady-state window after warm-up; on whole swarm epochs where the window
holds two epoch changes or more):

- swarmhub swarm: two swarmhub workers (``train()`` with a JoinResponse built like the tests' ``make_join``, the
  server's bootstrap/monitor peer ``python -m swarmhub.server.swarm.bootstrap_peer``) in one swarm. The second joins the
  first after the first's solo window, as volunteers join a running experiment; the window starts at the first
  epoch they finish together;
- solo: each worker alone in a swarm of one, the same code as in the swarm (``train()``, its own
  bootstrap/monitor peer, hivemind's optimizer, DHT, averagers and p2pd). Not a bare loop: the efficiency is then
  what collaborating costs, not what the worker costs over bare PyTorch (worker_overhead.py measures that).
  Measured two ways in the same run:
  * side by side (primary): A and B at the same time, each alone in its own swarm of one. The two "volunteers"
    share this machine's 2 cores; run side by side, each solo worker gets the same share of the machine as in
    the swarm (one core for its training thread, the rest shared by everyone's hivemind helper processes), so
    the ratio isolates the cost of collaborating (averaging rounds, waiting for peers, the second peer's traffic);
  * one at a time (secondary): the first worker's solo window before the second joins (A in odd rounds, B in
    even). A worker alone on the machine also has the second core for its hivemind helper processes, which it
    loses in the swarm: on 2 cores this ratio measures the machine as much as swarmhub;
- machine: bare loops of the workload (no swarm), one alone and then two at once. Two single-thread trainers
  at once may get less than twice one alone's rate from the hardware itself (shared caches, memory bandwidth,
  clocks): their ratio is the most that the one-at-a-time efficiency can reach on this machine, printed beside it;
- plain: the same two-peer swarm as a plain ``hivemind.DHT`` + ``hivemind.Optimizer`` loop configured like
  hivemind's ALBERT example (offload_optimizer, delay_optimizer_step, delay_grad_averaging, fp16 compression for
  gradients and state, the example's averager and progress-tracker options, verbose False) with the same model,
  data, batch, target batch size, matchmaking time and averaging timeout, bootstrapping from a bare DHT peer. No
  swarmhub code in its loop.

Every worker trains on one thread (torch.set_num_threads(1), OMP_NUM_THREADS=1), so two workers fit the 2
cores. The target batch size is sized for the machine at the start (a 2 s bare loop of the workload on one thread:
what two such workers gather in about 7 s), so that epochs stay well above matchmaking_time and the epoch-length
guard does not hold the swarm back; --target-batch-size fixes it instead. The variants alternate within each
round (the order flips every round); the report gives the median and the min..max range over rounds, and the
cores each process used in each window.

efficiency = swarmhub swarm / (solo A + solo B)   target >= 0.9 (side by side; one at a time also shown)
ratio      = swarmhub swarm / plain swarm         target >= 1.0

Command: ``.venv/bin/python bench/swarm_efficiency.py [--quick]`` (full: 2 rounds, about 5 minutes on a
2-core machine; --quick: a smoke run under a minute: 1 round, short windows, no side-by-side solos). Exits 0
whether the targets are met or not; nonzero only when the benchmark itself fails. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

import _common as c


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    solo_warmup: float  # seconds after a solo worker's first progress line
    solo_window: float
    swarm_window: float
    epoch_seconds: float  # the target batch size is what two workers of this machine compute in this time
    matchmaking_time: float
    side_by_side: bool
    stop_timeout: float  # a worker stopped in an averaging round its partner left is killed after this


# epoch_seconds: swarm epochs of ~7 s (2 workers), well above matchmaking_time (the default's 3 s), so that the
# epoch-length guard never holds the swarm back and what is measured is the cost of collaborating; solo epochs ~14 s
FULL = Mode("full", rounds=2, solo_warmup=3.0, solo_window=15.0, swarm_window=21.0, epoch_seconds=7.0,
            matchmaking_time=3.0, side_by_side=True, stop_timeout=8.0)  # fmt: skip
QUICK = Mode("quick", rounds=1, solo_warmup=1.0, solo_window=3.0, swarm_window=5.0, epoch_seconds=3.0,
             matchmaking_time=2.0, side_by_side=False, stop_timeout=3.0)  # fmt: skip


OVERLAP: str | None = None  # --overlap: the experiment's overlap setting for the swarmhub variants
TARGET_BATCH_SIZE = 0  # sized for this machine in main() (calibrate), or --target-batch-size


def experiment(mode: Mode) -> dict[str, Any]:
    return c.experiment_config(
        target_batch_size=TARGET_BATCH_SIZE, matchmaking_time=mode.matchmaking_time, overlap=OVERLAP
    )


def swarmhub_round(h: c.Harness, r: int, mode: Mode, first: str, second: str) -> dict[str, Any]:
    """The first worker alone (its solo window), then the second joins it (the swarm window)."""
    peer = h.swarm_peer(f"r{r}-peer")
    exp = experiment(mode)

    def start(name: str) -> c.Proc:
        identity = h.tmp / f"r{r}-{name}.key"
        join = c.join_json(peer, f"worker-{name}", identity, exp)
        return h.worker(f"r{r}-swarmhub-{name}", "swarmhub", {"join": join, "identity": str(identity)})

    w1 = start(first)
    t0 = c.wait_progress([w1], 120) + mode.solo_warmup
    c.sleep_until(t0)
    cpu0 = c.cpu_seconds([w1, peer.proc])
    c.sleep_until(t0 + mode.solo_window)
    t1 = time.time()
    solo_cpu = c.cpu_share(cpu0, c.cpu_seconds([w1, peer.proc]), t1 - t0)
    solo = c.swarm_rate([w1], t0, t1)  # a swarm of one never averages: any window is steady

    w2 = start(second)
    joined = c.wait_progress([w2], 120)
    t0 = c.wait_epochs([w1, w2], 1, 180, since=joined)  # the first epoch they both finish together
    cpu0 = c.cpu_seconds([w1, w2, peer.proc])
    c.sleep_until(t0 + mode.swarm_window)
    t1 = time.time()
    swarm_cpu = c.cpu_share(cpu0, c.cpu_seconds([w1, w2, peer.proc]), t1 - t0)
    codes = h.stop([w1, w2, peer.proc], timeout=mode.stop_timeout)
    if any(code not in (0, None) for code in codes):
        raise c.BenchError(f"swarmhub round {r}: exit codes {codes}\n{w1.log_tail()}\n{w2.log_tail()}")
    swarm, how = c.swarm_rate([w1, w2], t0, t1)
    in_window = [e for w in (w1, w2) for e in c.progress(w.events) if t0 <= e["t"] <= t1]
    changes = [e for e in in_window if e.get("epoch_change")]
    return {
        "solo_worker": first,
        "solo": solo[0],
        "solo_cpu": solo_cpu,
        "swarm": swarm,
        "swarm_how": how,
        "blocked": c.longest_silence([w1, w2], t0, t1),
        "swarm_cpu": swarm_cpu,
        "averaged": f"{sum(1 for e in changes if e.get('averaged_peers') == 2)}/{len(changes)}",
        "min_peers": min((e.get("peers", 0) for e in in_window), default=0),
    }


def side_by_side_round(h: c.Harness, r: int, mode: Mode) -> dict[str, Any]:
    """A and B at the same time, each alone in its own swarm of one (its own bootstrap/monitor peer)."""
    peers = h.swarm_peers([f"r{r}-solo-peer-A", f"r{r}-solo-peer-B"])
    exp = experiment(mode)
    workers = []
    for name, peer in zip("AB", peers, strict=True):
        identity = h.tmp / f"r{r}-solo-{name}.key"
        join = c.join_json(peer, f"worker-{name}", identity, exp)
        workers.append(h.worker(f"r{r}-solo-{name}", "swarmhub", {"join": join, "identity": str(identity)}))
    t0 = c.wait_progress(workers, 120) + mode.solo_warmup
    c.sleep_until(t0)
    procs = [*workers, *(p.proc for p in peers)]
    cpu0 = c.cpu_seconds(procs)
    c.sleep_until(t0 + mode.solo_window)
    t1 = time.time()
    cpu = c.cpu_share(cpu0, c.cpu_seconds(procs), t1 - t0)
    codes = h.stop(procs, timeout=mode.stop_timeout)
    if any(code not in (0, None) for code in codes):
        raise c.BenchError(f"side-by-side round {r}: exit codes {codes}\n{workers[0].log_tail()}")
    rates = [c.swarm_rate([w], t0, t1)[0] for w in workers]
    return {"sbs_A": rates[0], "sbs_B": rates[1], "sbs_cpu": cpu}


def machine_round(h: c.Harness, r: int, mode: Mode) -> dict[str, Any]:
    """Bare loops of the workload (no swarm): one alone, then two at once. What two single-thread trainers get of
    this machine at once, against one at a time: the most that the one-at-a-time efficiency can reach here."""
    config = c.bare_loop_config(experiment(mode))

    def measure(names: str) -> list[float]:
        loops = [h.worker(f"r{r}-bare-{n}", "bare", {**config, "data_seed": i}) for i, n in enumerate(names)]
        t0 = c.wait_progress(loops, 120) + mode.solo_warmup
        c.sleep_until(t0 + mode.solo_window)
        t1 = time.time()
        codes = h.stop(loops)
        if codes != [0] * len(loops):
            raise c.BenchError(f"bare round {r}: exit codes {codes}\n{loops[0].log_tail()}")
        return [c.swarm_rate([loop], t0, t1)[0] for loop in loops]

    return {"bare_alone": measure("A")[0], "bare_together": sum(measure("AB"))}


def plain_round(h: c.Harness, r: int, mode: Mode) -> dict[str, Any]:
    """Two plain hivemind peers (ALBERT's configuration) that bootstrap from a bare DHT peer."""
    boot = h.worker(f"r{r}-plain-boot", "plain-bootstrap", {})
    maddrs = boot.reader.wait_for("ready", 60)["maddrs"]
    exp = experiment(mode)
    config = {
        "initial_peers": maddrs,
        "run_id": f"plain-{uuid.uuid4().hex[:8]}",
        **c.bare_loop_config(exp),
        "target_batch_size": exp["target_batch_size"],
        "matchmaking_time": exp["matchmaking_time"],
        "averaging_timeout": exp["averaging_timeout"],
    }
    workers = [h.worker(f"r{r}-plain-{n}", "plain", {**config, "data_seed": i}) for i, n in enumerate("AB")]
    c.wait_progress(workers, 120)
    t0 = c.wait_epochs(workers, 1, 180)
    cpu0 = c.cpu_seconds([*workers, boot])
    c.sleep_until(t0 + mode.swarm_window)
    t1 = time.time()
    cpu = c.cpu_share(cpu0, c.cpu_seconds([*workers, boot]), t1 - t0)
    codes = h.stop([*workers, boot], timeout=mode.stop_timeout)
    if any(code not in (0, None) for code in codes):
        raise c.BenchError(f"plain round {r}: exit codes {codes}\n{workers[0].log_tail()}")
    plain, how = c.swarm_rate(workers, t0, t1)
    in_window = [e for w in workers for e in c.progress(w.events) if t0 <= e["t"] <= t1]
    return {
        "plain": plain,
        "plain_how": how,
        "plain_blocked": c.longest_silence(workers, t0, t1),
        "plain_cpu": cpu,
        "min_peers": min((e.get("peers", 0) for e in in_window), default=0),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    c.add_overlap_option(
        parser, "the experiment's overlap setting for the swarmhub workers (default: the experiment default, none)"
    )
    parser.add_argument(
        "--target-batch-size",
        type=int,
        default=None,
        help="the experiment's target batch size (default: what two workers of this machine compute in the mode's "
        "epoch time, measured with a bare loop at the start)",
    )
    args = parser.parse_args()
    global OVERLAP, TARGET_BATCH_SIZE
    OVERLAP = args.overlap
    mode = QUICK if args.quick else FULL
    rounds = args.rounds or mode.rounds
    print(f"swarm_efficiency ({mode.name}): {c.machine_line()}")
    TARGET_BATCH_SIZE = c.sized_target(args.target_batch_size, 2, mode.epoch_seconds, c.HIDDEN_SIZE, c.BATCH_SIZE)
    exp = experiment(mode)
    params = exp["task_params"]
    print(
        f"workload: digits MLP hidden_size={params['hidden_size']}, batch {params['batch_size']}"
        f"/step, target_batch_size {exp['target_batch_size']}, adam lr {exp['learning_rate']}, matchmaking_time "
        f"{exp['matchmaking_time']} s, averaging_timeout {exp['averaging_timeout']} s, swarmhub overlap "
        f"{exp.get('overlap', 'none (default)')}; one thread per worker; "
        f"{rounds} round(s)"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    results: list[dict[str, Any]] = []
    with c.Harness("efficiency") as h:
        for r in range(rounds):
            first, second = ("A", "B") if r % 2 == 0 else ("B", "A")
            row: dict[str, Any] = {}
            order = ["swarmhub", "side-by-side solos", "plain", "machine"]
            if not mode.side_by_side:
                order.remove("side-by-side solos")
                order.remove("machine")
            if r % 2:
                order.reverse()
            for variant in order:
                with c.phase(f"round {r + 1}/{rounds}: {variant}"):
                    if variant == "swarmhub":
                        row.update(swarmhub_round(h, r, mode, first, second))
                    elif variant == "plain":
                        plain = plain_round(h, r, mode)
                        row["plain_min_peers"] = plain.pop("min_peers")
                        row.update(plain)
                    elif variant == "machine":
                        row.update(machine_round(h, r, mode))
                    else:
                        row.update(side_by_side_round(h, r, mode))
            results.append(row)
        cleanup = h.check_no_leftovers()
    report(results, rounds, time.monotonic() - started)
    print(cleanup)
    print(load.line())
    return 0


def report(results: list[dict[str, Any]], rounds: int, elapsed: float) -> None:
    solos = {w: [r["solo"] for r in results if r["solo_worker"] == w] for w in "AB"}
    note = ""
    if not solos["B"] or not solos["A"]:
        measured = "A" if solos["A"] else "B"
        other = "B" if measured == "A" else "A"
        solos[other] = solos[measured]  # the two workers run identical compute; only their data order differs
        note = f" (worker {other} was not measured alone in this run: its solo is taken as {measured}'s)"
    sum_seq = c.median(solos["A"]) + c.median(solos["B"])
    swarm = [r["swarm"] for r in results]
    plain = [r["plain"] for r in results]
    eff_seq = [s / sum_seq for s in swarm]
    ratio = [s / p for s, p in zip(swarm, plain, strict=True)]
    side = [r for r in results if "sbs_A" in r]
    sum_sbs = [r["sbs_A"] + r["sbs_B"] for r in side]
    eff_sbs = [r["swarm"] / (r["sbs_A"] + r["sbs_B"]) for r in side]

    def cells(values: list[float]) -> list[Any]:
        return [*values, c.median(values), c.spread(values)]

    print()
    print(f"results ({rounds} round(s), {elapsed:.0f} s; samples/s; median and min..max over rounds):")
    headers = ["variant", *[f"round {i + 1}" for i in range(rounds)], "median", "spread"]
    rows = []
    if side:
        rows += [
            ["solo A, side by side", *cells([r["sbs_A"] for r in side])],
            ["solo B, side by side", *cells([r["sbs_B"] for r in side])],
            ["sum of solos, side by side", *cells(sum_sbs)],
        ]
    rows += [
        ["solo, one at a time", *[f"{r['solo']:,.0f} ({r['solo_worker']})" for r in results],
         c.median([r["solo"] for r in results]), c.spread([r["solo"] for r in results])],
        ["sum of solos, one at a time", *[f"{sum_seq:,.0f}" for _ in results], sum_seq, "-"],
        ["swarmhub swarm (2 workers)", *cells(swarm)],
        ["plain hivemind swarm (2)", *cells(plain)],
    ]  # fmt: skip
    if side:
        rows.append(["efficiency, side by side", *cells(eff_sbs)])
    rows += [["efficiency, one at a time", *cells(eff_seq)], ["ratio swarmhub/plain", *cells(ratio)]]
    machine = [r for r in results if "bare_alone" in r]
    ceiling = [r["bare_together"] / (2 * r["bare_alone"]) for r in machine]
    if machine:
        rows += [
            ["bare loop alone", *cells([r["bare_alone"] for r in machine])],
            ["two bare loops at once (sum)", *cells([r["bare_together"] for r in machine])],
            ["machine: two at once / 2 x one", *cells(ceiling)],
        ]
    print(c.table(headers, rows))
    print(f"one at a time: sum = median(solo A) + median(solo B){note}")
    for i, r in enumerate(results):
        print(
            f"round {i + 1}: swarmhub window {r['swarm_how']}, fewest peers seen {r['min_peers']}, epoch changes "
            f"after averaging with 2 peers {r['averaged']}, longest silence {r['blocked']:.1f} s; plain window "
            f"{r['plain_how']}, fewest peers {r['plain_min_peers']}, longest silence {r['plain_blocked']:.1f} s"
        )
        side_cpu = f" | side by side {r['sbs_cpu']}" if "sbs_cpu" in r else ""
        print(
            f"  cores used (main process + its hivemind helper processes): one at a time {r['solo_cpu']}{side_cpu}"
            f" | swarmhub {r['swarm_cpu']} | plain {r['plain_cpu']}"
        )
    if side:
        eff = c.median(eff_sbs)
        print(f"efficiency (side-by-side solos) = {eff:.3f} (target >= 0.9): {c.verdict(eff >= 0.9)}")
    eff = c.median(eff_seq)
    primary = "" if side else " [side-by-side solos not measured in --quick]"
    print(f"efficiency (one-at-a-time solos) = {eff:.3f} (target >= 0.9): {c.verdict(eff >= 0.9)}{primary}")
    if machine:
        most = c.median(ceiling)
        print(
            f"  this machine gives two single-thread bare loops at once {most:.3f} of what one alone gets twice: the "
            f"most a swarm of two can reach against one-at-a-time solos here; one-at-a-time efficiency / that = "
            f"{eff / most:.3f}"
        )
    rat = c.median(ratio)
    print(f"swarmhub/plain = {rat:.3f} (target >= 1.0): {c.verdict(rat >= 1.0)}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, KeyboardInterrupt) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
