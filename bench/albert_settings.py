"""ALBERT settings: held-out loss at equal samples of the demo's workload under candidate optimizer settings, beside
the unigram baseline of the same held-out set.

What it measures: the demo's exact setup (``swarmhub demo``'s demo-albert: the tiny ALBERT, the Python standard
library's docstrings prepared as the server prepares them, ``corpus.prepare`` with the demo's vocabulary and sequence
length, the task's masking, its weight-decay groups, its warm-up and linear-decay schedule, the project's LAMB or
torch's AdamW), trained in one process with gradients accumulated to the candidate's collaborative batch: what a
swarm whose peers all take part computes per step (``bench/convergence.py`` measures how close a real swarm comes).
For each candidate it prints the held-out loss (``AlbertMLMTask.evaluate``) after 20k, 60k, 120k and 240k samples,
and beside it the unigram baseline: the cross-entropy of predicting each masked held-out label by its frequency in
the training shards, special tokens left out (``AlbertMLMTask.baseline``), i.e. a model that knows only token
frequencies. A setting learns language where its loss falls clearly below that line.

Loss at equal samples does not depend on the machine's speed or load (same seeds, same result), so it may run on a
busy machine; the samples/s it prints do. The swarm's samples in a given time are the demo's business: two peers of
about 260 samples/s each on a quiet 2-core machine (``swarmhub demo``), so 8 minutes of demo are about 100k-120k
samples.

Command: ``.venv/bin/python bench/albert_settings.py [--setting NAME=OPT,LR,BATCH,WARMUP[,TOTAL]]... [--samples
20000,60000,120000,240000] [--text-bytes N]`` (without ``--setting``: the demo's settings and the candidates
below). Each candidate of 240k samples takes about 10 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

CACHE = Path("/tmp/swarmhub-bench-albert")  # prepared corpora, one folder per (text, vocabulary, sequence length)
SEED = 0  # the model's initial weights
DATA_SEED = 1000  # the order of the shards and the masks


@dataclass(frozen=True)
class Setting:
    name: str
    optimizer: str  # lamb or adamw
    learning_rate: float
    batch: int  # the collaborative batch: samples per optimizer step
    warmup: int  # steps
    total: int  # steps after which the linear decay reaches 0

    @classmethod
    def parse(cls, text: str) -> Setting:
        name, _, spec = text.partition("=")
        parts = spec.split(",")
        if len(parts) not in (4, 5) or parts[0] not in ("lamb", "adamw"):
            raise SystemExit(f"--setting {text!r}: expected NAME=lamb|adamw,LR,BATCH,WARMUP[,TOTAL]")
        total = int(parts[4]) if len(parts) == 5 else 5000
        return cls(name, parts[0], float(parts[1]), int(parts[2]), int(parts[3]), total)


# The demo's settings before issue 42, then candidates (names say optimizer, rate, batch, warm-up).
CANDIDATES = [
    Setting("demo before: lamb 0.05/256/w5", "lamb", 0.05, 256, 5, 5000),
    Setting("lamb 0.01/512/w20", "lamb", 0.01, 512, 20, 5000),
    Setting("lamb 0.02/1024/w10", "lamb", 0.02, 1024, 10, 5000),
    Setting("lamb 0.01/1024/w10", "lamb", 0.01, 1024, 10, 5000),
]


def prepare_corpus(text_bytes: int, vocab_size: int, seq_length: int) -> Path:
    """The demo's corpus, prepared exactly as ``training_data.attach`` prepares it (cached between runs)."""
    from swarmhub.server.corpus import text as corpus
    from swarmhub.server.corpus import training_data

    options = training_data.CorpusOptions(vocab_size=vocab_size, seq_length=seq_length)
    text = corpus.builtin_text("python-docstrings", max_bytes=text_bytes)
    key = hashlib.sha256(f"{text}\0{options.vocab_size}\0{options.seq_length}".encode()).hexdigest()[:16]
    folder = CACHE / key
    if not (folder / "manifest.json").is_file():
        started = time.monotonic()
        corpus.prepare(
            text,
            folder,
            vocab_size=options.vocab_size,
            seq_length=options.seq_length,
            source="builtin:python-docstrings",
        )
        print(f"prepared the corpus in {time.monotonic() - started:.0f} s: {folder}")
    return folder


def baseline(task: Any, folder: Path) -> Any:
    """The unigram baseline of the held-out labels that ``task.evaluate`` scores (same sequences, same masks)."""
    return task.baseline([folder / shard["name"] for shard in task.data.manifest["shards"]])


def make_task(folder: Path, size: str, batch_size: int, setting: Setting) -> Any:
    from swarmhub.worker.tasks.albert import AlbertMLMTask
    from swarmhub.worker.tasks.data import LocalCorpus

    task = AlbertMLMTask(
        {"size": size, "batch_size": batch_size, "warmup_steps": setting.warmup, "total_steps": setting.total}
    )
    task.attach(LocalCorpus(folder))
    return task


def train(task: Any, setting: Setting, checkpoints: list[int]) -> tuple[list[float], float]:
    """Held-out loss at each checkpoint (samples), and the samples per second it trained at."""
    from swarmhub.worker.training.lamb import Lamb

    torch.manual_seed(SEED)
    model = task.build_model()
    model.train()
    groups = list(task.parameter_groups(model))
    if setting.optimizer == "lamb":
        opt: torch.optim.Optimizer = Lamb(groups, lr=setting.learning_rate)
    else:
        opt = torch.optim.AdamW(groups, lr=setting.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, task.lr_schedule())
    batches = task.batches(DATA_SEED)
    micro = max(setting.batch // task.batch_size, 1)
    device = torch.device("cpu")
    samples, losses, todo = 0, [], list(checkpoints)
    started = time.monotonic()
    trained = 0.0
    while todo:
        for _ in range(micro):
            (task.loss(model, next(batches), device) / micro).backward()
            samples += task.batch_size
        opt.step()
        opt.zero_grad()
        schedule.step()
        while todo and samples >= todo[0]:
            trained += time.monotonic() - started
            losses.append(task.evaluate(model, device))
            print(f"  {setting.name} at {todo.pop(0):,} samples: {losses[-1]:.3f}", file=sys.stderr, flush=True)
            started = time.monotonic()
    return losses, samples / max(trained, 1e-9)


def main() -> int:
    from swarmhub.server.cli import DEMO_TEXT_BYTES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", default=[], help="NAME=lamb|adamw,LR,BATCH,WARMUP[,TOTAL]")
    parser.add_argument("--samples", default="20000,60000,120000,240000", help="checkpoints, in samples")
    parser.add_argument("--text-bytes", type=int, default=DEMO_TEXT_BYTES)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--seq-length", type=int, default=64)
    parser.add_argument("--size", default="tiny")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="micro-batch: the gradient of a step is the mean over its whole batch whatever this is (the demo's "
        "peers take 16), larger is faster on a CPU",
    )
    parser.add_argument("--threads", type=int, default=1, help="1: OpenMP spins on a busy machine with more")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = [Setting.parse(s) for s in args.setting] or CANDIDATES
    checkpoints = sorted(int(float(x)) for x in args.samples.split(","))

    folder = prepare_corpus(args.text_bytes, args.vocab_size, args.seq_length)
    probe = make_task(folder, args.size, args.batch_size, settings[0])
    manifest = probe.data.manifest
    base = baseline(probe, folder)
    train_sequences = int(manifest["train_sequences"])
    print(
        f"corpus: {args.text_bytes:,} bytes of docstrings, vocabulary {manifest['vocab_size']}, sequences of "
        f"{manifest['seq_length']} tokens: {train_sequences:,} training sequences in {len(manifest['shards'])} "
        f"shards, {manifest['eval_sequences']} held out; model {args.size}, micro-batch {args.batch_size}, "
        f"{args.threads} threads"
    )
    print(
        f"unigram baseline of the held-out set: {base.cross_entropy:.3f} nats (top-1 {base.top1:.1%}, top-5 "
        f"{base.top5:.1%}, {base.labels:,} masked labels)"
    )
    print("passes over the training sequences at each checkpoint: " + ", ".join(
        f"{x // 1000}k: {x / train_sequences:.1f}" for x in checkpoints
    ))  # fmt: skip
    header = "setting".ljust(34) + "".join(f"{x // 1000}k".rjust(9) for x in checkpoints) + "   samples/s"
    print(header)
    for setting in settings:
        task = make_task(folder, args.size, args.batch_size, setting)
        losses, rate = train(task, setting, checkpoints)
        cells = "".join(f"{loss:9.3f}" for loss in losses)
        below = "".join(f"{base.cross_entropy - loss:+9.2f}" for loss in losses)
        print(f"{setting.name:<34}{cells}   {rate:,.0f}", flush=True)
        print(f"{'  below the baseline':<34}{below}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
