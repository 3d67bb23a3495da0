"""Convergence: loss against samples seen, a swarm of two swarmhub workers against one process with the same
global batch, optimizer and learning rate.

What it measures: the loss of the model on the whole digits data set (1,797 images: the digits task trains on
all of them and has no held-out split; the full-data loss is the objective itself, measured without the noise of
a per-step mini-batch loss) at each optimizer step, against the samples the run has consumed so far:

- swarm: two swarmhub workers (``train()``, server's bootstrap/monitor peer, one thread each) with
  ``target_batch_size`` samples per swarm epoch. At each epoch change each worker evaluates its model (caught
  through ``training.load_task``); the swarm's samples at epoch e are the sum of both workers' samples when they
  entered e (what went into the averaged gradients, overshoot past the target included);
- single: one process, same model initialisation (same torch seed), Adam with the same learning rate, gradients
  of ``target_batch_size / batch_size`` micro-batches accumulated (averaged) into one step per global batch:
  what hivemind's optimizer computes for the swarm when every peer takes part. One thread too (more threads
  on a busy 2-core machine make OpenMP spin; its speed does not enter the comparison anyway);
- single, hivemind's Adam start (diagnostic): the same process after hivemind's own optimizer initialisation
  (``initialize_optimizer_state_``: one Adam step on zero gradients, which hivemind.Optimizer runs on the
  optimizer it builds). It separates what hivemind's optimizer semantics cost from what the swarm costs.

The swarm's curve depends on timing (how far each epoch overshoots the target, averaging rounds that fail), so it
is repeated; the single process's curves have no timing in them (same seeds, same result every run), so each
runs once, between the swarm repeats. The curves are interpolated (linearly in samples) at 25, 50, 75 and 100 %
of the sample budget; the swarm's loss over the single process's loss is reported per checkpoint (median and
min..max over the swarm repeats). Target: every checkpoint's median ratio swarm/single within 5 % (0.95..1.05).

``--task albert-mlm``: the same comparison on the demo's workload (``swarmhub demo``'s demo-albert: the tiny ALBERT
on the standard library's docstrings prepared as the server prepares them, its optimizer, rate, schedule and target
batch, ``server/cli.py`` ``DEMO_ALBERT``), measured by the held-out loss the server's checkpoint peer reports
(``AlbertMLMTask.evaluate``), for a swarm of 2 peers and a swarm of 3 in which one peer is throttled to half its
speed (it sleeps as long as each step took), against one process that builds and starts its optimizer as the
worker's hivemind optimizer does. Target: every checkpoint of every repeat within 5 %.

Command: ``.venv/bin/python bench/convergence.py [--quick] [--task albert-mlm]`` (digits, full: 3 swarm repeats of 8
global batches, about 4 minutes on a quiet 2-core machine; --quick: one swarm of 2 global batches, under a minute;
albert-mlm, full: 3 repeats of each swarm over 80 global batches, about 15 minutes). Exits 0 whether the target is
met or not; nonzero only when the benchmark itself fails. Leaves no process behind.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import _common as c

# Each swarm epoch must be paced by compute, as in real runs: when a peer can reach the target batch within
# hivemind's progress-refresh interval (0.5 s at least) or swarmhub's minimum epoch length (matchmaking_time),
# each peer counts mostly its own samples and the swarm overshoots the target by up to one target per peer (with
# a 1024-sample target and millisecond steps, global batches of 1,600 were measured). So: a wide MLP and a target
# of 131,072 samples (a few seconds of compute per swarm epoch; with 1,797 images that is ~73 passes over the
# data per step, close to full-batch gradients). Calibrated so that 8 global steps take the full-data loss from
# 2.3 to about 0.37, still falling: differences show.
HIDDEN_SIZE = 2048
BATCH_SIZE = 256
TARGET_BATCH_SIZE = 131_072  # replaced in main(): what the two workers compute in EPOCH_SECONDS on this machine
EPOCH_SECONDS = 3.0  # "epochs of a few seconds": 131,072 was about that on the 2-core machines of 2026-11-30
LEARNING_RATE = 3e-3
MATCHMAKING_TIME = 2.0
AVERAGING_TIMEOUT = 10.0
SEED = 0  # torch seed of the initial weights, in every process


@dataclass(frozen=True)
class Mode:
    name: str
    repeats: int
    epochs: int  # the sample budget, in global batches
    checkpoints: tuple[float, ...]


FULL = Mode("full", repeats=3, epochs=8, checkpoints=(0.25, 0.5, 0.75, 1.0))
QUICK = Mode("quick", repeats=1, epochs=2, checkpoints=(0.5, 1.0))


def experiment() -> dict[str, Any]:
    return c.experiment_config(
        hidden_size=HIDDEN_SIZE,
        batch_size=BATCH_SIZE,
        target_batch_size=TARGET_BATCH_SIZE,
        learning_rate=LEARNING_RATE,
        matchmaking_time=MATCHMAKING_TIME,
        averaging_timeout=AVERAGING_TIMEOUT,
    )


def swarm_curve(workers: list[c.Proc]) -> tuple[list[tuple[float, float]], dict[str, Any]]:
    """(samples, loss) per swarm epoch, and some facts about the run."""
    changes: dict[int, dict[int, dict[str, Any]]] = {}  # epoch -> worker index -> its change event
    for i, w in enumerate(workers):
        for e in c.progress(w.events):
            if e.get("epoch_change") and "eval_loss" in e:
                changes.setdefault(e["epoch"], {})[i] = e
    init = [e["eval_loss"] for w in workers for e in w.events if e.get("event") == "init"]
    curve: list[tuple[float, float]] = [(0.0, init[0])] if init else []
    gaps = []
    for epoch in sorted(changes):
        by_worker = changes[epoch]
        when = max(e["t"] for e in by_worker.values())
        total = 0
        for i, w in enumerate(workers):
            if i in by_worker:
                total += by_worker[i]["samples"]
            else:  # this worker did not enter the epoch by itself (it had not joined yet, or skipped it)
                before = [e for e in c.progress(w.events) if e["t"] <= when]
                total += before[-1]["samples"] if before else 0
        losses = [e["eval_loss"] for e in by_worker.values()]
        if len(losses) == len(workers):
            gaps.append(max(losses) - min(losses))
        curve.append((float(total), sum(losses) / len(losses)))
    averaged = sum(1 for by in changes.values() for e in by.values() if e.get("averaged_peers") == len(workers))
    entered = sum(len(by) for by in changes.values())
    facts = {
        "epochs": len(changes),
        "averaged": f"{averaged}/{entered}",
        "max_gap": max(gaps, default=float("nan")),
        "batch": _mean_batch(curve),
        "first": curve[1][0] if len(curve) > 1 else float("nan"),  # the first global batch: both start together
    }
    return curve, facts


def _mean_batch(curve: list[tuple[float, float]]) -> float:
    if len(curve) < 3:
        return float("nan")
    steps = [
        b[0] - a[0] for a, b in zip(curve[1:], curve[2:], strict=False)
    ]  # from epoch 1 on: the first one includes startup
    return sum(steps) / len(steps)


def interpolate(curve: list[tuple[float, float]], x: float) -> float:
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return float("nan")


def run_swarm(
    h: c.Harness,
    r: int,
    budget: int,
    exp: dict[str, Any] | None = None,
    slowdowns: tuple[float, ...] = (1.0, 1.0),
    extra: dict[str, Any] | None = None,
) -> tuple[list[tuple[float, float]], dict[str, Any]]:
    """One swarm of ``len(slowdowns)`` workers (each that many times slower than the machine lets it train), until
    it has consumed ``budget`` samples. ``exp``: the experiment (default: the digits workload); ``extra``: more of
    each worker's config (the corpus of a task that needs one)."""
    exp = exp or experiment()
    target = exp["target_batch_size"]
    peer = h.swarm_peer(f"r{r}-peer")
    workers = []
    for name, slowdown in zip("ABCDEFGH", slowdowns, strict=False):
        identity = h.tmp / f"r{r}-{name}.key"
        join = c.join_json(peer, f"worker-{r}-{name}", identity, exp)
        config = {"join": join, "identity": str(identity), "seed": SEED, "evaluate": True, **(extra or {})}
        if slowdown != 1.0:
            config["slowdown"] = slowdown
        workers.append(h.worker(f"r{r}-swarm-{name}", "swarmhub", config))
    deadline = time.monotonic() + 120 + 10 * len(slowdowns) * budget / target
    while True:  # until the swarm has consumed the budget
        curve, _ = swarm_curve(workers)
        if curve and curve[-1][0] >= budget:
            break
        c.check_alive(workers)
        if time.monotonic() > deadline:
            raise c.BenchError(f"the swarm did not reach {budget} samples in time (curve {curve[-3:]})")
        time.sleep(0.3)
    codes = h.stop([*workers, peer.proc], timeout=exp["averaging_timeout"] + 10)
    if any(code not in (0, None) for code in codes):
        raise c.BenchError(f"swarm repeat {r}: exit codes {codes}\n{workers[0].log_tail()}")
    return swarm_curve(workers)


def run_single(h: c.Harness, name: str, budget: int, hivemind_start: bool) -> list[tuple[float, float]]:
    config = {
        "hidden_size": HIDDEN_SIZE,
        "batch_size": BATCH_SIZE,
        "target_batch_size": TARGET_BATCH_SIZE,
        "learning_rate": LEARNING_RATE,
        "seed": SEED,
        "data_seed": 1000,
        "max_samples": budget,
        "hivemind_start": hivemind_start,
    }
    proc = h.worker(name, "single", config)
    proc.reader.wait_for("summary", 600)
    codes = h.stop([proc])
    if codes != [0]:
        raise c.BenchError(f"{name}: exit code {codes}\n{proc.log_tail()}")
    return [(float(e["samples"]), e["eval_loss"]) for e in c.progress(proc.events)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of under a minute")
    parser.add_argument("--repeats", type=int, default=None, help="override the number of swarm repeats")
    parser.add_argument(
        "--target-batch-size",
        type=int,
        default=None,
        help="the swarm's target batch (default: what its 2 workers compute in 3 s here, from a 2 s bare loop)",
    )
    parser.add_argument(
        "--task",
        choices=("digits", "albert-mlm"),
        default="digits",
        help="albert-mlm: the demo's ALBERT workload, swarms of 2 peers and of 3 (one at half speed)",
    )
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    repeats = args.repeats or mode.repeats
    if args.task == "albert-mlm":
        return main_albert(ALBERT_QUICK if args.quick else ALBERT_FULL, args.repeats)
    print(f"convergence ({mode.name}): {c.machine_line()}")
    global TARGET_BATCH_SIZE
    TARGET_BATCH_SIZE = c.sized_target(args.target_batch_size, 2, EPOCH_SECONDS, HIDDEN_SIZE, BATCH_SIZE)
    budget = mode.epochs * TARGET_BATCH_SIZE
    print(
        f"workload: digits MLP hidden_size={HIDDEN_SIZE}, batch {BATCH_SIZE}/step, target_batch_size "
        f"{TARGET_BATCH_SIZE} (the single process accumulates {TARGET_BATCH_SIZE // BATCH_SIZE} micro-batches per "
        f"step), adam lr {LEARNING_RATE}, same initial weights (torch seed {SEED}); swarm "
        f"matchmaking_time {MATCHMAKING_TIME} s, averaging_timeout {AVERAGING_TIMEOUT} s; budget {budget:,} "
        f"samples; {repeats} swarm repeat(s)"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    swarms: list[tuple[list[tuple[float, float]], dict[str, Any]]] = []
    singles: dict[str, list[tuple[float, float]]] = {}
    # The single process's curve is deterministic (same seeds, no timing in it): once each, between swarm repeats.
    plan: list[str] = []
    for r in range(repeats):
        plan.append("swarm")
        if r < 2:
            plan.append(["single", "single, hivemind's Adam start"][r])
    plan += [v for v in ("single", "single, hivemind's Adam start") if v not in plan]
    with c.Harness("convergence") as h:
        for n, variant in enumerate(plan):
            with c.phase(f"{n + 1}/{len(plan)}: {variant}"):
                if variant == "swarm":
                    swarms.append(run_swarm(h, len(swarms), budget))
                else:
                    hivemind_start = variant != "single"
                    name = "single-hivemind-start" if hivemind_start else "single"
                    singles[variant] = run_single(h, name, budget, hivemind_start)
        cleanup = h.check_no_leftovers()
    report(mode, budget, swarms, singles, time.monotonic() - started)
    print(cleanup)
    print(load.line())
    return 0


def report(
    mode: Mode,
    budget: int,
    swarms: list[tuple[list[tuple[float, float]], dict[str, Any]]],
    singles: dict[str, list[tuple[float, float]]],
    elapsed: float,
) -> None:
    single, hm = singles["single"], singles["single, hivemind's Adam start"]
    print()
    print(f"results ({len(swarms)} swarm repeat(s), {elapsed:.0f} s): full-data loss at equal samples seen")
    rows = []
    worst = 0.0
    for fraction in mode.checkpoints:
        x = fraction * budget
        swarm = [interpolate(curve, x) for curve, _ in swarms]
        base, base_hm = interpolate(single, x), interpolate(hm, x)
        ratios = [s / base for s in swarm]
        ratios_hm = [s / base_hm for s in swarm]
        worst = max(worst, abs(c.median(ratios) - 1.0))
        rows.append(
            [f"{x:,.0f} ({fraction:.0%})", base, base_hm, c.median(swarm), c.spread(swarm), c.median(ratios),
             c.spread(ratios), c.median(ratios_hm), c.spread(ratios_hm)]
        )  # fmt: skip
    headers = ["samples seen", "single", "single, hm start", "swarm", "spread", "swarm/single", "spread",
               "swarm/single hm start", "spread"]  # fmt: skip
    print(c.table(headers, rows))
    print(
        "single, hm start: the single process with hivemind's optimizer start, i.e. one Adam step on zero gradients "
        "before training (hivemind.optim.state_averager.initialize_optimizer_state_, which hivemind.Optimizer runs "
        "to create the optimizer state it shares): Adam's step counter then runs one ahead, and its bias correction "
        "shrinks the first real updates (x0.74, x0.86, x0.91, ...)"
    )
    for i, (_, facts) in enumerate(swarms):
        print(
            f"swarm repeat {i + 1}: {facts['epochs']} epochs, first global batch {facts['first']:,.0f} samples, mean "
            f"from epoch 1 on {facts['batch']:,.0f} (target {TARGET_BATCH_SIZE}), epoch changes after averaging with "
            f"2 peers {facts['averaged']}, "
            f"largest loss gap between the two workers' models {facts['max_gap']:.2g}"
        )
    print("curves (samples in thousands: loss):")
    print("  single           " + " ".join(f"{x / 1000:,.0f}:{y:.3f}" for x, y in single))
    print("  single, hm start " + " ".join(f"{x / 1000:,.0f}:{y:.3f}" for x, y in hm))
    for i, (curve, _) in enumerate(swarms):
        print(f"  swarm {i + 1}          " + " ".join(f"{x / 1000:,.0f}:{y:.3f}" for x, y in curve))
    print(f"worst checkpoint, swarm/single: {worst:.1%} off (target within 5%): {c.verdict(worst <= 0.05)}")
    batches = [facts["batch"] / TARGET_BATCH_SIZE for _, facts in swarms]
    print(
        "mean global batch / target_batch_size, each repeat: "
        + ", ".join(f"{b:.3f}" for b in batches)
        + f" (target <= 1.05 in every repeat): {c.verdict(all(b <= 1.05 for b in batches))}"
    )


# -- albert-mlm: the demo's workload ---------------------------------------------------------------------------

ALBERT_FULL = Mode("full", repeats=3, epochs=80, checkpoints=(0.25, 0.5, 0.75, 1.0))
ALBERT_QUICK = Mode("quick", repeats=1, epochs=8, checkpoints=(0.5, 1.0))
# Each swarm: (label, slowdown of each worker). The 3-peer swarm has one peer throttled to half its speed (it sleeps
# as long as each step took); all three share the machine's 2 cores with the bootstrap peer.
ALBERT_SWARMS = (("2 peers", (1.0, 1.0)), ("3 peers, one at half speed", (1.0, 1.0, 2.0)))


def albert_experiment() -> dict[str, Any]:
    """The demo's experiment (``swarmhub demo``'s demo-albert), as the server stores it."""
    from swarmhub.common.protocol import TrainingSettings
    from swarmhub.server.cli import DEMO_ALBERT

    return TrainingSettings(**DEMO_ALBERT).model_dump(mode="json")


def main_albert(mode: Mode, repeats: int | None) -> int:
    """Swarms of the demo's ALBERT workload against one process at equal samples: the held-out loss the server's
    checkpoint peer measures (``AlbertMLMTask.evaluate``), on the demo's corpus prepared as the server prepares it."""
    import albert_settings

    from swarmhub.server.cli import DEMO_CORPUS, DEMO_TEXT_BYTES

    repeats = repeats or mode.repeats
    print(f"convergence, albert-mlm ({mode.name}): {c.machine_line()}")
    exp = albert_experiment()
    folder = albert_settings.prepare_corpus(DEMO_TEXT_BYTES, DEMO_CORPUS.vocab_size, DEMO_CORPUS.seq_length)
    target = exp["target_batch_size"]
    budget = mode.epochs * target
    print(
        f"workload: the demo's ALBERT ({exp['task_params']}), {exp['optimizer']} lr {exp['learning_rate']}, target "
        f"batch {target}, matchmaking_time {exp['matchmaking_time']} s, corpus {folder}; same initial weights (torch "
        f"seed {SEED}); budget {budget:,} samples ({mode.epochs} global batches); {repeats} repeat(s) of each swarm"
    )
    started = time.monotonic()
    load = c.MachineLoad()
    swarms: dict[str, list[tuple[list[tuple[float, float]], dict[str, Any]]]] = {
        label: [] for label, _ in ALBERT_SWARMS
    }
    single: list[tuple[float, float]] = []
    plan = [label for _ in range(repeats) for label, _ in ALBERT_SWARMS]
    plan.insert(1, "single")  # deterministic (same seeds, no timing in it): once
    slowdowns = dict(ALBERT_SWARMS)
    with c.Harness("convergence-albert") as h:
        for n, variant in enumerate(plan):
            with c.phase(f"{n + 1}/{len(plan)}: {variant}"):
                if variant == "single":
                    config = {"experiment": exp, "corpus": str(folder), "seed": SEED, "data_seed": 1000}
                    proc = h.worker("single", "single", {**config, "max_samples": budget})
                    proc.reader.wait_for("summary", 1800)
                    codes = h.stop([proc])
                    if codes != [0]:
                        raise c.BenchError(f"single: exit code {codes}\n{proc.log_tail()}")
                    single = [(float(e["samples"]), e["eval_loss"]) for e in c.progress(proc.events)]
                else:
                    r = sum(len(v) for v in swarms.values())
                    swarms[variant].append(run_swarm(h, r, budget, exp, slowdowns[variant], {"corpus": str(folder)}))
        cleanup = h.check_no_leftovers()
    elapsed = time.monotonic() - started
    print()
    print(f"results ({elapsed:.0f} s): held-out loss at equal samples seen")
    worst = 0.0
    headers = ["samples seen", "single", *[f"{label}: swarm/single, each repeat" for label, _ in ALBERT_SWARMS]]
    rows = []
    for fraction in mode.checkpoints:
        x = fraction * budget
        base = interpolate(single, x)
        row: list[Any] = [f"{x:,.0f} ({fraction:.0%})", base]
        for label, _ in ALBERT_SWARMS:
            ratios = [interpolate(curve, x) / base for curve, _ in swarms[label]]
            worst = max([worst, *(abs(r - 1.0) for r in ratios)])
            row.append(" ".join(f"{r:.3f}" for r in ratios))
        rows.append(row)
    print(c.table(headers, rows))
    for label, _ in ALBERT_SWARMS:
        for i, (curve, facts) in enumerate(swarms[label]):
            print(
                f"{label}, repeat {i + 1}: {facts['epochs']} epochs, mean global batch from epoch 1 on "
                f"{facts['batch']:,.0f} (target {target}), epoch changes after averaging with every peer "
                f"{facts['averaged']}, largest held-out loss gap between the peers' models {facts['max_gap']:.2g}"
            )
            print("  curve (samples in thousands: loss): " + " ".join(f"{x / 1000:,.1f}:{y:.3f}" for x, y in curve))
    print("single curve: " + " ".join(f"{x / 1000:,.1f}:{y:.3f}" for x, y in single))
    print(
        f"worst checkpoint of any repeat, swarm/single: {worst:.1%} off (target within 5%): {c.verdict(worst <= 0.05)}"
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
