"""Worker overhead: the swarmhub worker's training loop, reporting on, against a bare PyTorch loop of the same
model and data.

What it measures (samples/s over a steady-state window after warm-up, one thread each):

- swarmhub: what ``swarmhub join SLUG`` runs after login, against a real ``swarmhub server`` that this benchmark
  starts on 127.0.0.1 (temp SQLite database, SWARMHUB_SWARM_ENABLED=true so the server runs the experiment's
  bootstrap/monitor peer): the real join route, ``run_session`` (hivemind's logs to a file, signal handling, the
  console progress line), ``train()`` with hivemind's Optimizer, DHT, averagers and p2pd in a swarm of one (the
  worker alone, so it does the same compute as the bare loop: its only averaging partner is the server's witness,
  which holds no gradients; no state download), the real
  ``Reporter`` sending every report over the websocket (and keeping it in join's on-disk spool until the server
  acknowledges it), the deny-list poll and token renewal. The window is whole
  swarm epochs, so it holds each epoch's optimizer step and its averaging round with the server's witness;
- bare: ``for batch: loss.backward(); adam.step(); zero_grad()`` on the same digits model, batch and data, no
  swarm, no reporting.

ratio = swarmhub / bare, target >= 0.97. The ratio includes everything the worker adds (the hivemind optimizer in
a swarm of one, its helper processes, the reporter, the progress line); the server and its peer run on this
machine too (in production they run elsewhere). Rounds alternate the two variants (order flipped each round);
the report gives the median and min..max over rounds.

``--compare-overlap`` also runs the worker with the experiment's ``overlap`` at ``delayed-averaging`` in each round,
against ``none`` (the rounds then run bare, none, delayed-averaging, the order flipped each round), for
a peer with a core to spare (one training thread; its helpers, the server and the witness it averages with every
epoch share the other core). It prints the ratio and what ``overlap: auto`` picks for the worker's device.

``--device cuda`` runs both loops on the CUDA device, in the precision the worker's ``--precision auto`` picks
there (bf16 where supported; ``--precision`` chooses another): the GPU peer's case (``bench/gpu/check.sh`` runs it on
a machine with a GPU). Each round prints the device, precision and overlap the worker says it trained with.

Command: ``.venv/bin/python bench/worker_overhead.py [--quick] [--compare-overlap] [--device cuda]`` (full: 3
rounds, about 4-5 minutes on a 2-core machine, 6-7 with --compare-overlap; --quick: one short round, under a
minute). Exits 0
whether the target is met or not; nonzero only when the benchmark itself fails. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _common as c
import httpx
from _server import SwarmhubServer


@dataclass(frozen=True)
class Mode:
    name: str
    rounds: int
    warmup: float  # seconds after the bare loop's first progress line
    window: float
    epoch_seconds: float  # of compute for one worker: what the target batch is sized for
    matchmaking_time: float


# The target batch is sized for the machine: ``epoch_seconds`` of a bare loop's samples, at the rate a 2 s bare loop
# measures at the start (``--target-batch-size`` fixes it). The worker trains 1.2 to 1.5 times as fast as the bare
# loop (hivemind steps the optimizer once an epoch, the bare loop at every batch), so its epochs are shorter: about
# 5.5 s at 8. swarmhub's loop makes an epoch last at least matchmaking_time (3 s, the experiment default), which caps
# a swarm at target_batch_size / matchmaking_time samples/s: the cap must stay well above the worker's rate, or the
# ratio measures the cap (a fixed 98,304 capped one machine at 32,768 samples/s, below its bare loop; sized for 5 s,
# a worker ran at 85 % of the cap, with epochs at the guard). At 8 s the cap is 2.7 times the bare rate. Each round
# prints the cap and says when the worker ran near it. The window holds 4 to 5 whole epochs.
FULL = Mode("full", rounds=3, warmup=3.0, window=25.0, epoch_seconds=8.0, matchmaking_time=3.0)
QUICK = Mode("quick", rounds=1, warmup=1.0, window=8.0, epoch_seconds=5.0, matchmaking_time=2.0)
TARGET_BATCH_SIZE = 0  # set in main
DEVICE = "cpu"  # --device: where both loops compute
PRECISION = "fp32"  # what the worker's ``--precision auto`` picks on DEVICE; the bare loop computes in it too
DELAYED = "delayed-averaging"


def swarmhub_round(
    h: c.Harness, server: SwarmhubServer, r: int, mode: Mode, overlap: str | None = None
) -> dict[str, Any]:
    """The worker alone in its experiment's swarm with the server's peers (the witness averages with it every
    epoch), with the experiment's ``overlap`` (None: the default)."""
    slug = server.start_experiment(
        experiment=c.experiment_config(
            target_batch_size=TARGET_BATCH_SIZE, matchmaking_time=mode.matchmaking_time, overlap=overlap
        )
    )
    name = f"r{r}-swarmhub" + (f"-{overlap}" if overlap else "")
    state = h.tmp / f"{name}-state"
    state.mkdir()
    config = {
        "url": server.url,
        "token": server.token,
        "slug": slug,
        "state_dir": str(state),
        "device": DEVICE,
        "precision": PRECISION,
    }
    worker = h.worker(name, "server", config)
    c.wait_progress([worker], 180)
    t0 = c.wait_epochs([worker], 1, 120)  # the first epoch ends (startup and first-epoch estimates behind us)
    cpu0, monitor0 = c.cpu_seconds([worker, server.proc]), server.monitor_seconds()
    c.sleep_until(t0 + mode.window)
    t1 = time.time()
    cpu1, monitor1 = c.cpu_seconds([worker, server.proc]), server.monitor_seconds()
    cpu = c.cpu_share(cpu0, cpu1, t1 - t0)
    codes = h.stop([worker])
    server.finish(slug)
    summary = next((e for e in worker.events if e.get("event") == "summary"), {})
    if codes[0] not in (0, None):
        raise c.BenchError(f"swarmhub round {r}: exit code {codes}\n{worker.log_tail()}")
    measured = c.swarm_rate([worker], t0, t1)
    reports = len(c.progress(worker.events))
    changes = [e for e in c.progress(worker.events) if e.get("epoch_change") and t0 <= e["t"] <= t1]
    # The worker's helper processes (DHT, averagers, p2pd) per training step, and the server's swarm processes
    # (its bootstrap/monitor peer) in cores: issue targets <= 1.5 ms per step and <= 0.05 cores per worker.
    steps = c.samples_at(worker.events, t1) - c.samples_at(worker.events, t0)
    steps /= c.BATCH_SIZE
    helper_seconds = cpu1[worker.name][1] - cpu0[worker.name][1]
    server_helpers = (cpu1[server.proc.name][1] - cpu0[server.proc.name][1]) / (t1 - t0)
    return {
        "helper_ms_per_step": 1000 * helper_seconds / max(steps, 1),
        "steps_per_second": steps / (t1 - t0),
        "server_peer_cores": server_helpers,
        "monitor_cores": (monitor1 - monitor0) / (t1 - t0),
        "rate_cap": TARGET_BATCH_SIZE / mode.matchmaking_time,
        "swarmhub": measured[0],
        "swarmhub_how": measured[1],
        "swarmhub_cpu": cpu,
        "reports": reports,
        "unacked": summary.get("unacked", "?"),
        "peers": max((e.get("peers", 0) for e in c.progress(worker.events)), default=0),
        "trained_with": trained_with(state / "join.log"),
        "averaged": f"{sum(1 for e in changes if (e.get('averaged_peers') or 0) >= 2)}/{len(changes)}",
    }


def trained_with(log: Path) -> str:
    """What the worker says it trained with (``train``'s "training on ..." line in its join log)."""
    try:
        lines = [line for line in log.read_text(errors="replace").splitlines() if "training on " in line]
    except OSError:
        return "?"
    return lines[-1].split("training on ", 1)[1].strip() if lines else "?"


def bare_round(h: c.Harness, r: int, mode: Mode) -> dict[str, Any]:
    exp = c.experiment_config(target_batch_size=TARGET_BATCH_SIZE)
    config = {**c.bare_loop_config(exp), "data_seed": r, "device": DEVICE, "precision": PRECISION}
    worker = h.worker(f"r{r}-bare", "bare", config)
    t0 = c.wait_progress([worker], 120) + mode.warmup
    c.sleep_until(t0)
    cpu0 = c.cpu_seconds([worker])
    c.sleep_until(t0 + mode.window)
    t1 = time.time()
    cpu = c.cpu_share(cpu0, c.cpu_seconds([worker]), t1 - t0)
    codes = h.stop([worker])
    if codes != [0]:
        raise c.BenchError(f"bare round {r}: exit code {codes}\n{worker.log_tail()}")
    measured = c.swarm_rate([worker], t0, t1)
    return {"bare": measured[0], "bare_how": measured[1], "bare_cpu": cpu}


def device_and_precision(name: str, precision: str) -> tuple[str, str]:
    """``--device`` and ``--precision`` as the worker resolves them (``auto``: what the worker picks there),
    printed."""
    import torch

    from swarmhub.worker.errors import WorkerError
    from swarmhub.worker.training.peer import resolve_device, resolve_precision

    try:
        device = resolve_device(name)
        precision = resolve_precision(precision, device)
    except WorkerError as exc:
        raise SystemExit(f"worker_overhead: {exc}") from None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
    print(f"device: {device} ({where}), precision {precision} for both loops")
    return str(device), precision


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    parser.add_argument("--rounds", type=int, default=None, help="override the number of rounds")
    parser.add_argument(
        "--target-batch-size",
        type=int,
        default=None,
        help="the experiment's target batch size (default: what one worker of this machine computes in the mode's "
        "epoch time, measured with a bare loop at the start)",
    )
    parser.add_argument(
        "--compare-overlap",
        action="store_true",
        help="also run the worker with overlap delayed-averaging in each round, against none: a peer with a core "
        "to spare (one training thread on a machine of two or more cores)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where the worker (swarmhub join --device) and the bare loop compute: cpu (default) or cuda",
    )
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="the worker's --precision, and the bare loop's (auto: bf16 on a CUDA device that supports it, else "
        "fp16; fp32 on the CPU)",
    )
    args = parser.parse_args()
    global TARGET_BATCH_SIZE, DEVICE, PRECISION
    mode = QUICK if args.quick else FULL
    rounds = args.rounds or mode.rounds
    print(f"worker_overhead ({mode.name}): {c.machine_line()}")
    DEVICE, PRECISION = device_and_precision(args.device, args.precision)
    TARGET_BATCH_SIZE = c.sized_target(
        args.target_batch_size, 1, mode.epoch_seconds, c.HIDDEN_SIZE, c.BATCH_SIZE, device=DEVICE, precision=PRECISION
    )
    exp = c.experiment_config(target_batch_size=TARGET_BATCH_SIZE, matchmaking_time=mode.matchmaking_time)
    params = exp["task_params"]
    print(
        f"workload: digits MLP hidden_size={params['hidden_size']}, batch {params['batch_size']}"
        f"/step, adam lr {exp['learning_rate']}; swarmhub: target_batch_size {exp['target_batch_size']}, "
        f"matchmaking_time {exp['matchmaking_time']} s, a swarm of one; one thread each, on {DEVICE} in {PRECISION}; "
        f"{rounds} round(s)"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    results: list[dict[str, Any]] = []
    with c.Harness("overhead") as h:
        with c.phase("starting swarmhub server (temp SQLite, swarm enabled)"):
            server = SwarmhubServer(h, "server", f"sqlite:///{h.tmp / 'server.db'}", swarm=True)
        try:
            for r in range(rounds):
                row: dict[str, Any] = {}
                order = ["bare", "swarmhub"] if r % 2 == 0 else ["swarmhub", "bare"]
                if args.compare_overlap:  # none and delayed-averaging back to back, their order flipped each round
                    order = ["bare", "swarmhub", DELAYED] if r % 2 == 0 else [DELAYED, "swarmhub", "bare"]
                for variant in order:
                    with c.phase(f"round {r + 1}/{rounds}: {variant}"):
                        if variant == "swarmhub":
                            overlap = "none" if args.compare_overlap else None
                            row.update(swarmhub_round(h, server, r, mode, overlap))
                        elif variant == DELAYED:
                            delayed = swarmhub_round(h, server, r, mode, DELAYED)
                            row.update({f"delayed_{key}": value for key, value in delayed.items()})
                        else:
                            row.update(bare_round(h, r, mode))
                results.append(row)
        finally:
            server.close()
        h.stop([server.proc], timeout=60)
        cleanup = h.check_no_leftovers()
    report(results, rounds, time.monotonic() - started)
    if args.compare_overlap:
        report_overlap(results)
    print(cleanup)
    print(load.line())
    return 0


def report_overlap(results: list[dict[str, Any]]) -> None:
    """The worker with a core to spare: delayed-averaging against none, round by round, and what ``auto`` picks."""
    import torch

    from swarmhub.common.protocol import Overlap
    from swarmhub.worker.training.overlap import choose_overlap

    none = [r["swarmhub"] for r in results]
    delayed = [r["delayed_swarmhub"] for r in results]
    ratios = [d / n for d, n in zip(delayed, none, strict=True)]
    print()
    if DEVICE == "cpu":
        print("overlap, for a worker with a core to spare (one training thread; its helpers and the server's peers")
        print("share the other core): samples/s, median and min..max over rounds")
    else:
        print(f"overlap, for a worker computing on {DEVICE} in {PRECISION} (one CPU thread feeds it; its helpers and")
        print("the server's peers share the other cores): samples/s, median and min..max over rounds")
    headers = ["overlap", *[f"round {i + 1}" for i in range(len(results))], "median", "spread"]
    rows = [
        c.summary_row("none", none),
        c.summary_row("delayed-averaging", delayed),
        c.summary_row("ratio delayed-averaging/none", ratios),
    ]
    print(c.table(headers, rows))
    for i, r in enumerate(results):
        print(
            f"round {i + 1}: epochs averaged with the witness: none {r['averaged']}, delayed-averaging "
            f"{r['delayed_averaged']}; helpers {r['helper_ms_per_step']:.2f} vs {r['delayed_helper_ms_per_step']:.2f} "
            f"ms per step; cores {r['swarmhub_cpu']} vs {r['delayed_swarmhub_cpu']}"
        )
        print(f"  trained on: none {r['trained_with']}; delayed-averaging {r['delayed_trained_with']}")
    device = torch.device(DEVICE)
    auto = choose_overlap(Overlap.auto, device, bandwidth=None)
    kind = (
        "a CUDA peer"
        if device.type == "cuda"
        else "a CPU peer, its link to the server loopback, not measured: a fast link"
    )
    print(f"overlap auto picks {auto.value} for this worker ({kind}); delayed-averaging/none = {c.median(ratios):.3f}")


def report(results: list[dict[str, Any]], rounds: int, elapsed: float) -> None:
    bare = [r["bare"] for r in results]
    swarmhub = [r["swarmhub"] for r in results]
    ratios = [s / b for s, b in zip(swarmhub, bare, strict=True)]
    print()
    print(f"results ({rounds} round(s), {elapsed:.0f} s; samples/s; median and min..max over rounds):")
    headers = ["variant", *[f"round {i + 1}" for i in range(rounds)], "median", "spread"]
    rows = [
        c.summary_row("bare PyTorch loop", bare),
        c.summary_row("swarmhub worker (swarm of one)", swarmhub),
        c.summary_row("ratio swarmhub/bare", ratios),
    ]
    print(c.table(headers, rows))
    for i, r in enumerate(results):
        print(
            f"round {i + 1}: swarmhub window {r['swarmhub_how']}, {r['reports']} reports sent over the websocket "
            f"({r['unacked']} not acknowledged, i.e. not stored, by the server at exit), most peers seen "
            f"{r['peers']}; bare window {r['bare_how']}"
        )
        print(f"  the worker trained on {r['trained_with']} (its join log)")
        print(f"  cores used (main process + its child processes): swarmhub {r['swarmhub_cpu']} | bare {r['bare_cpu']}")
        cap = r["rate_cap"]
        near = ""
        if r["swarmhub"] > 0.9 * cap:
            near = " (the worker ran near the cap: this round measures the cap, not the worker)"
        print(f"  the epoch-length guard allows at most {cap:,.0f} samples/s with these settings{near}")
        print(
            f"  worker's helper processes: {r['helper_ms_per_step']:.2f} ms CPU per training step at "
            f"{r['steps_per_second']:.0f} steps/s (target <= 1.5); the server's monitor peer (with its DHT and "
            f"p2pd) {r['monitor_cores']:.3f} cores for this one worker (target <= 0.05); all the server's swarm "
            f"processes (the monitor and the witness) {r['server_peer_cores']:.3f} cores"
        )
    print(
        "the swarmhub side adds: hivemind.Optimizer in a swarm of one (gradient accumulation every step, one "
        "optimizer step and one averaging round with the server's witness per epoch, the progress tracker), its DHT, "
        "averager and p2pd processes, swarmhub's loop (the loss summed on the device and read back once a report, "
        "a report every 2 s and at each epoch), the websocket Reporter and its on-disk spool, the deny-list poll, "
        "token renewal and the console progress line; the ratio includes all of it"
    )
    med = c.median(ratios)
    print(f"swarmhub/bare = {med:.3f} (target >= 0.97): {c.verdict(med >= 0.97)}")


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (c.BenchError, KeyboardInterrupt, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
