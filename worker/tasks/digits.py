"""Handwritten digits (scikit-learn's bundled 8x8 UCI digits): a small MLP that trains in seconds on a CPU."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from swarmhub.worker.tasks import Baseline, Task

if TYPE_CHECKING:  # the server validates a task's parameters without torch; workers import it when they train
    import torch


class DigitsParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(default=64, title="Hidden units", ge=4, le=4096, description="Width of the hidden layer")
    batch_size: int = Field(default=32, title="Local batch size", ge=1, le=1797, description="Samples per local step")


# The cost of one local step on the reference machine (bench/task_rates.py, one CPU thread, bare loop with Adam), in
# seconds: a fixed part (Python, autograd, the optimizer's per-tensor work), a part per hidden unit (the optimizer
# over the parameters), a part per sample (the input and output layers) and a part per sample and hidden unit (the
# hidden layer's products). Least-squares fit (relative) to 25 measured configurations, hidden 16 to 4,096 and local
# batch 8 to 1,797: within 20 % of each but the largest (hidden 4,096 with the whole data set as one batch, where the
# estimate is 1.9x the measured rate).
STEP_SECONDS = 2.65e-4
SECONDS_PER_UNIT = 2.21e-7
SECONDS_PER_SAMPLE = 3.05e-7
SECONDS_PER_SAMPLE_AND_UNIT = 4.49e-9


class DigitsTask(Task):
    name = "digits"
    title = "Handwritten digits (MLP, scikit-learn's bundled data)"
    Params = DigitsParams
    params: DigitsParams

    proposed_matchmaking_time = 2.0  # a small vector: rounds are short, so peers can meet more often
    baseline_label = "knows only how often each digit occurs"

    @property
    def batch_size(self) -> int:
        return self.params.batch_size

    def reference_samples_per_second(self) -> float:
        size, hidden = self.params.batch_size, self.params.hidden_size
        step = STEP_SECONDS + SECONDS_PER_UNIT * hidden + SECONDS_PER_SAMPLE * size
        return size / (step + SECONDS_PER_SAMPLE_AND_UNIT * hidden * size)

    def build_model(self) -> torch.nn.Module:
        import torch

        hidden = self.params.hidden_size
        return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))

    @staticmethod
    def _data() -> tuple[torch.Tensor, torch.Tensor]:
        import torch
        from sklearn.datasets import load_digits

        digits = load_digits()
        features = torch.as_tensor(digits.data / 16.0, dtype=torch.float32)
        labels = torch.as_tensor(digits.target, dtype=torch.long)
        return features, labels

    def batches(self, seed: int) -> Iterator[Any]:
        import numpy as np
        import torch

        features, labels = self._data()
        rng = np.random.default_rng(seed)
        size = self.params.batch_size
        while True:
            order = torch.as_tensor(rng.permutation(len(labels)))
            for start in range(0, len(order) - size + 1, size):
                index = order[start : start + size]
                yield features[index], labels[index]

    def baseline(self, shard_paths: Iterable[Path] = ()) -> Baseline:
        """The class prior on the data set the training loss is measured on: its cross-entropy is the entropy of
        the digits' frequencies, its top-1 accuracy that of always guessing the most frequent digit."""
        import numpy as np
        from sklearn.datasets import load_digits

        counts = np.bincount(load_digits().target, minlength=10)
        shares = np.sort(counts / counts.sum())[::-1]
        entropy = float(-(shares[shares > 0] * np.log(shares[shares > 0])).sum())
        return Baseline(
            cross_entropy=entropy, top1=float(shares[0]), top5=float(shares[:5].sum()), labels=int(counts.sum())
        )

    def loss(self, model: torch.nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        import torch

        features, labels = batch
        logits = model(features.to(device))
        return torch.nn.functional.cross_entropy(logits, labels.to(device))
