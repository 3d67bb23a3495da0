"""The aggregation rules in one process, without a swarm: where the senders' standing holds and where it ends.

    .venv/bin/python bench/aggregation_sim.py [--optimizer adam] [--lr 0.01] [--steps 30] [--samples 8] [--seeds 5]

Four simulated peers on digits share one model. Each step every peer computes its gradient on ``--samples`` random
samples; the fourth sends it (a) x100, (b) sign-flipped, (c) as noise of its norm, or not at all (``absent``: three
honest peers, the best any rule can do). The vector is cut into four slices, as four reducers would, and each slice
goes through ``aggregation.combine`` with one ``Standing`` per run (a reducer's, across rounds). Prints the model's
loss on the whole data set after ``--steps`` steps (median over ``--seeds``), against the clean run under ``mean``.
Few samples per peer make every part mostly noise: the regime of a volunteer's batch late in training.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from swarmhub.worker.swarm.aggregation import Standing, combine
from swarmhub.worker.tasks.digits import DigitsTask

ATTACKS = ["none", "absent", "x100", "sign-flip", "noise"]


def run(args: argparse.Namespace, aggregation: str, attack: str, seed: int) -> float:
    features, labels = DigitsTask._data()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    optimizer_class = torch.optim.SGD if args.optimizer == "sgd" else torch.optim.Adam
    optimizer = optimizer_class(model.parameters(), lr=args.lr)
    generator = torch.Generator().manual_seed(seed)
    standing = Standing()
    senders = [f"peer-{i}" for i in range(4)]
    weights = [float(args.samples)] * 3 + [0.0 if attack == "absent" else float(args.samples)]
    for _ in range(args.steps):
        parts = []
        for peer in range(4):
            index = torch.randint(0, len(labels), (args.samples,), generator=generator)
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(features[index]), labels[index]).backward()
            vector = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
            if peer == 3 and attack == "x100":
                vector = vector * 100
            elif peer == 3 and attack == "sign-flip":
                vector = -vector
            elif peer == 3 and attack == "noise":
                noise = torch.randn(vector.shape, generator=generator)
                vector = noise * vector.norm() / noise.norm()
            parts.append(vector)
        slices = zip(*(part.tensor_split(4) for part in parts), strict=True)
        result = torch.cat([combine(list(s), weights, aggregation, senders, standing) for s in slices])
        offset = 0
        for p in model.parameters():
            p.grad = result[offset : offset + p.numel()].reshape(p.shape).clone()
            offset += p.numel()
        optimizer.step()
    with torch.no_grad():
        loss = float(torch.nn.functional.cross_entropy(model(features), labels))
    return loss if loss == loss else float("inf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="adam")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    losses = {
        (aggregation, attack): statistics.median(run(args, aggregation, attack, seed) for seed in range(args.seeds))
        for aggregation in ("mean", "centered-clip")
        for attack in ATTACKS
    }
    clean = losses["mean", "none"]
    print(f"{args.optimizer} lr {args.lr}, {args.steps} steps, {args.samples} samples per peer, {args.seeds} seeds")
    print("| attack | mean | centered-clip with the standing |\n| --- | --- | --- |")
    for attack in ATTACKS:
        mean, clip = losses["mean", attack], losses["centered-clip", attack]
        print(f"| {attack} | {mean:.3f} ({mean / clean:.2f}x) | {clip:.3f} ({clip / clean:.2f}x) |")


if __name__ == "__main__":
    main()
