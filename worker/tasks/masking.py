"""What BERT-style masking needs, numpy only: the tokenizer's vocabulary as masking reads it (which ids are special,
which are ``##`` pieces, which a random replacement may take) and a random choice of positions per row. Used by the
``albert-mlm`` task (``albert.py``) on workers and by the server when it measures a corpus's baseline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

IGNORE = -100  # the label torch's cross-entropy skips


def choose_positions(candidates: np.ndarray, probability: float, rng: np.random.Generator) -> np.ndarray:
    """Per row, a random subset of the ``True`` positions: ``probability`` of them, rounded at random, at least
    one where the row has any."""
    available = candidates.sum(axis=1)
    wanted = np.floor(available * probability + rng.random(len(available))).astype(np.int64)
    wanted = np.clip(wanted, np.minimum(available, 1), available)
    scores = np.where(candidates, rng.random(candidates.shape), np.inf)
    rank = np.argsort(np.argsort(scores, axis=1), axis=1)  # each position's place in its row's random order
    return rank < wanted[:, None]


class Vocabulary:
    """What masking needs from the tokenizer: which ids are special, which are ``##`` pieces, and the ids a
    random replacement may take."""

    def __init__(self, model_size: int, special_ids: dict[str, int], pieces: dict[str, int], prefix: str):
        size = max(model_size, max(pieces.values(), default=-1) + 1)
        self.pad_id = int(special_ids["pad"])
        self.mask_id = int(special_ids["mask"])
        self.special = np.zeros(size, dtype=bool)
        self.special[[int(i) for i in special_ids.values()]] = True
        self.continuation = np.zeros(size, dtype=bool)
        for token, index in pieces.items():
            if token.startswith(prefix):
                self.continuation[index] = True
        self.ordinary = np.flatnonzero(~self.special[:model_size])  # ids the model's output layer has

    @classmethod
    def load(cls, tokenizer_json: Path, manifest: dict[str, Any]) -> Vocabulary:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_json))
        prefix = getattr(tokenizer.model, "continuing_subword_prefix", None) or "##"
        return cls(int(manifest["vocab_size"]), manifest["special_tokens"], tokenizer.get_vocab(), prefix)
