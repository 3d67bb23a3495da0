"""What the guarded reducer costs: hivemind's reducer, swarmhub's with `mean` and with `centered-clip`, side by side.

    .venv/bin/python bench/reducer.py [--senders 4 16] [--parts 64] [--repeats 5]

Each variant reduces the same slices (hivemind's part size, 128Ki float32 = 512 KiB, the default of
``hivemind.averaging``), every sender's part sent concurrently through ``accumulate_part`` as hivemind's
all-reduce calls it, in one process on one thread. Prints the time per part (median of the repeats) and its ratio
to hivemind's, and the memory the guarded reducer holds per slice (one part per sender, where hivemind's holds one
accumulator). Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import torch

from swarmhub.worker.swarm import policy, robust

PART = 128 * 1024  # float32 elements: 512 KiB


def reduce_all(make, senders: int, parts: list[list[torch.Tensor]]) -> float:  # noqa: ANN001
    """Seconds to reduce ``len(parts[0])`` slices from ``senders`` senders."""

    async def run() -> None:
        reducer = make([p.shape for p in parts[0]], senders)

        async def send(i: int) -> None:
            for index, part in enumerate(parts[i]):
                await reducer.accumulate_part(i, index, part, weight=64.0)

        await asyncio.gather(*(send(i) for i in range(senders)))

    started = time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--senders", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--parts", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from hivemind.averaging.partition import TensorPartReducer

    guarded = robust.make_reducer_class()
    print("| senders | hivemind (ms/part) | guarded mean | guarded centered-clip | held per slice |")
    print("| --- | --- | --- | --- | --- |")
    for senders in args.senders:
        generator = torch.Generator().manual_seed(senders)
        parts = [[torch.randn(PART, generator=generator) for _ in range(args.parts)] for _ in range(senders)]
        variants = {
            "hivemind": lambda shapes, n: TensorPartReducer(shapes, n),
            "mean": lambda shapes, n: guarded(shapes, n, [str(i) for i in range(n)]),
            "centered-clip": lambda shapes, n: guarded(shapes, n, [str(i) for i in range(n)]),
        }
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):  # interleaved, so that a slow spell hits every variant
            for name, make in variants.items():
                policy.POLICY.aggregation = "centered-clip" if name == "centered-clip" else "mean"
                times[name].append(reduce_all(make, senders, parts) / args.parts * 1000)
        policy.POLICY.aggregation = "mean"
        base = statistics.median(times["hivemind"])
        mean, clip = statistics.median(times["mean"]), statistics.median(times["centered-clip"])
        held = senders * PART * 4 / 2**20
        print(
            f"| {senders} | {base:.2f} | {mean:.2f} ({mean / base:.2f}x) | {clip:.2f} ({clip / base:.2f}x) "
            f"| {held:.1f} MiB (hivemind: 0.5 MiB) |"
        )


if __name__ == "__main__":
    main()
