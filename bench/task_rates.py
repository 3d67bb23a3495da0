"""Task rates: what one reference peer trains a second on each task, measured, next to the estimate the task's
proposal is sized with (``Task.reference_samples_per_second``, used by ``Task.proposal``).

What it measures: a bare PyTorch loop (forward, backward, Adam step, zero_grad) on one CPU thread
(``torch.set_num_threads(1)``), after a warm-up, for about ``--seconds`` per configuration:

- digits: the MLP at several hidden sizes and local batch sizes, on the task's own data;
- albert-mlm: each model size at local batch 8 on random token ids, 128 tokens a sequence and a vocabulary of
  8,000 (the corpus defaults), 15 % of the positions labelled.

For each configuration it prints the measured samples/s, the task's estimate and measured/estimate, and the
proposal the estimate gives (target batch size, matchmaking time, the swarm's rate cap and how many such peers it
keeps bound by compute). Target: no measurement more than 25 % above its estimate on the machine the constants were
fitted on (a proposal sized on a rate that is too low would throttle the swarm it was planned for; one too high
only proposes a larger batch than needed, and the report shows by how much).

Command: ``.venv/bin/python bench/task_rates.py [--quick]`` (full: about 2 minutes on a 2-core machine; --quick:
digits and ALBERT tiny only). Exits 0 whether the target is met or not; nonzero only when the benchmark itself
fails.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable

import _common as c
import torch

from swarmhub.worker.tasks import Task, get_task

DIGITS = [(64, 32), (64, 256), (256, 32), (1024, 32), (1024, 1797), (4096, 32), (4096, 512), (4096, 1797)]
ALBERT_SIZES = ["tiny", "small", "base", "large"]
TOLERANCE = 0.25


def timed(step: Callable[[], int], seconds: float, warmup: int = 3, least: int = 3) -> float:
    """Samples a second of ``step`` (which returns the samples it trained) over at least ``seconds``."""
    for _ in range(warmup):
        step()
    samples, steps, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < seconds or steps < least:
        samples += step()
        steps += 1
    return samples / (time.perf_counter() - start)


def digits_rate(hidden: int, batch: int, seconds: float) -> tuple[Task, float]:
    return get_task("digits")({"hidden_size": hidden, "batch_size": batch}), c.bare_rate(hidden, batch, seconds)


def albert_rate(size: str, seconds: float) -> tuple[Task, float]:
    from transformers import AlbertConfig, AlbertForMaskedLM

    from swarmhub.worker.tasks.albert import PRESETS, REFERENCE_SEQ_LENGTH

    task = get_task("albert-mlm")({"size": size})
    vocab, batch = 8000, 8
    config = AlbertConfig(
        vocab_size=vocab,
        max_position_embeddings=REFERENCE_SEQ_LENGTH,
        **PRESETS[size],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model = AlbertForMaskedLM(config)
    adam = torch.optim.Adam(model.parameters())
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (batch, REFERENCE_SEQ_LENGTH), generator=generator)
    labels = torch.where(torch.rand(ids.shape, generator=generator) < 0.15, ids, -100)
    mask = torch.ones_like(ids)

    def step() -> int:
        model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
        adam.step()
        adam.zero_grad()
        return batch

    return task, timed(step, seconds, warmup=1, least=2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="digits and ALBERT tiny only")
    parser.add_argument("--seconds", type=float, default=None, help="measuring time per configuration")
    args = parser.parse_args()
    seconds = args.seconds or (1.5 if args.quick else 4.0)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load = c.MachineLoad()
    runs: list[tuple[str, Callable[[], tuple[Task, float]]]] = [
        (f"digits hidden {h}, batch {b}", functools.partial(digits_rate, h, b, seconds)) for h, b in DIGITS
    ]
    sizes = ALBERT_SIZES[:1] if args.quick else ALBERT_SIZES
    runs += [(f"albert-mlm {s}, batch 8", functools.partial(albert_rate, s, seconds)) for s in sizes]
    print(c.machine_line())
    print(f"one CPU thread, bare loop with Adam, {seconds:g} s per configuration")
    print(f"{'configuration':<30} {'measured/s':>11} {'estimate/s':>11} {'ratio':>6}   proposal (8 planned peers)")
    worst, lowest = 0.0, float("inf")
    for name, run in runs:
        task, measured = run()
        estimate = task.reference_samples_per_second()
        proposal = task.proposal()
        assert estimate is not None and proposal is not None, f"{task.name} has no reference rate"
        ratio = measured / estimate
        worst, lowest = max(worst, ratio), min(lowest, ratio)
        print(
            f"{name:<30} {measured:>11,.1f} {estimate:>11,.1f} {ratio:>6.2f}   target {proposal.target_batch_size:,}, "
            f"matchmaking {proposal.matchmaking_time:g} s: cap {proposal.rate_cap:,.0f}/s, keeps "
            f"{proposal.unthrottled_peers:,.1f} such peers bound by compute"
        )
    print(load.line())
    print(
        f"measured/estimate from {lowest:.2f} to {worst:.2f}: no estimate more than {TOLERANCE:.0%} below the "
        f"measurement: {c.verdict(worst <= 1 + TOLERANCE)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
