"""The unigram baseline of a masked-language-model corpus: how well a model that knows only token frequencies
predicts the held-out masked tokens. The server computes it once when it prepares an experiment's text; the
dashboard draws it beside the held-out loss, and the benchmarks compare against it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
from pydantic import Field

from swarmhub.worker.tasks import Baseline
from swarmhub.worker.tasks.masking import IGNORE


class UnigramBaseline(Baseline):
    """How well a model that knows only token frequencies predicts the held-out masked tokens: the reference a
    trained model must beat. ``cross_entropy`` is in nats, like the held-out loss; ``top1`` and ``top5`` are the
    shares of the labels that are the most frequent token, or among the five most frequent."""

    top5: float = Field(ge=0.0, le=1.0)


def token_counts(shard_paths: Iterable[Path], vocab_size: int) -> np.ndarray:
    """How often each token id occurs in the shards: an int64 array of length ``vocab_size``, special tokens
    ([PAD] included) counted like the others (``unigram_baseline`` leaves them out). Ids at or above
    ``vocab_size`` are an error: a shard that does not belong to this vocabulary."""
    from swarmhub.worker.tasks.data import load_sequences

    counts = np.zeros(vocab_size, dtype=np.int64)
    for path in shard_paths:
        ids = load_sequences(Path(path)).ravel()
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
            raise ValueError(f"{Path(path).name} holds token ids outside the vocabulary of {vocab_size}")
        counts += np.bincount(ids, minlength=vocab_size).astype(np.int64)
    return counts


def unigram_baseline(counts: np.ndarray, labels: np.ndarray, special_ids: Iterable[int]) -> UnigramBaseline:
    """The unigram model's cross-entropy and top-1 / top-5 accuracy on ``labels`` (token ids; ``-100``, the
    positions the loss skips, are left out).

    The unigram model gives each ordinary token (not in ``special_ids``) the probability ``(count + 1) / (total +
    ordinary tokens)``: its frequency with add-one smoothing, so a held-out token never seen in training costs a
    finite loss; special tokens get none. Its top-k are the k ordinary tokens with the highest counts (the lower id
    first among equal counts)."""
    counts = np.asarray(counts, dtype=np.float64)
    ordinary = np.ones(len(counts), dtype=bool)
    ordinary[[int(i) for i in special_ids]] = False
    if not ordinary.any():
        raise ValueError("the vocabulary has no ordinary tokens")
    smoothed = np.where(ordinary, counts + 1.0, 0.0)
    probability = smoothed / smoothed.sum()
    labels = np.asarray(labels).ravel()
    labels = labels[labels != IGNORE]
    if labels.size == 0:
        return UnigramBaseline(cross_entropy=0.0, top1=0.0, top5=0.0, labels=0)
    if int(labels.min()) < 0 or int(labels.max()) >= len(counts):
        raise ValueError(f"labels hold token ids outside the vocabulary of {len(counts)}")
    if not ordinary[labels].all():
        raise ValueError("labels hold special tokens, which masking never chooses")
    cross_entropy = float(-np.log(probability[labels]).mean())
    order = np.argsort(-smoothed, kind="stable")  # most frequent first, the lower id among equals
    top = order[: min(5, int(ordinary.sum()))]
    return UnigramBaseline(
        cross_entropy=cross_entropy,
        top1=float(np.isin(labels, top[:1]).mean()),
        top5=float(np.isin(labels, top).mean()),
        labels=int(labels.size),
    )
