"""SwAV's network and its arithmetic: the backbone with a projection head and prototypes (``build_model``), the
Sinkhorn-Knopp codes every global crop is assigned (``sinkhorn``), and the k-nearest-neighbour accuracy its features
are judged by (``knn_top1``). The task that trains and measures it is :mod:`.swav`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from swarmhub.worker.tasks.swav import SwAVParams

KNN_NEIGHBOURS, KNN_TEMPERATURE = 20, 0.07


def sinkhorn(scores: torch.Tensor, epsilon: float, iterations: int) -> torch.Tensor:
    """Codes for ``scores`` (batch, prototypes): each row sums to 1 and each prototype takes an equal share of the
    batch, computed in fp32 and without gradient."""
    import torch

    with torch.no_grad():
        scores = scores.float()
        q = torch.exp((scores - scores.max()) / epsilon).t()  # prototypes x batch
        q /= q.sum()
        prototypes, batch = q.shape
        for _ in range(iterations):
            q /= q.sum(dim=1, keepdim=True)
            q /= prototypes
            q /= q.sum(dim=0, keepdim=True)
            q /= batch
        return (q * batch).t()


def build_model(params: SwAVParams) -> torch.nn.Module:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from swarmhub.worker.tasks.resnet import build_backbone

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = build_backbone(params.backbone)
            width = self.backbone.num_features
            self.projection = nn.Sequential(
                nn.Linear(width, params.hidden_dim),
                nn.BatchNorm1d(params.hidden_dim),
                nn.ReLU(inplace=True),
                nn.Linear(params.hidden_dim, params.feature_dim),
            )
            self.prototypes = nn.Linear(params.feature_dim, params.prototypes, bias=False)

        def embed(self, crops: list[torch.Tensor]) -> torch.Tensor:
            """Unit embeddings of every crop, in the order given (crops of one size go through together)."""
            out: list[torch.Tensor | None] = [None] * len(crops)
            by_size: dict[int, list[int]] = {}
            for i, crop in enumerate(crops):
                by_size.setdefault(crop.shape[-1], []).append(i)
            for indices in by_size.values():
                features = self.backbone(torch.cat([crops[i] for i in indices]))
                for i, part in zip(indices, self.projection(features).chunk(len(indices)), strict=True):
                    out[i] = part
            return F.normalize(torch.cat(out), dim=1)  # type: ignore[arg-type]

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return self.backbone(images)

    return Model()


def knn_top1(
    bank: torch.Tensor, bank_labels: Any, query: torch.Tensor, query_labels: Any, k: int = KNN_NEIGHBOURS
) -> float:
    """Weighted k-nearest-neighbour accuracy of unit features (Wu et al., 2018): each query's ``k`` most similar
    bank features vote for their label with weight exp(similarity / 0.07)."""
    import numpy as np
    import torch

    bank_y = torch.as_tensor(np.array(bank_labels))
    query_y = torch.as_tensor(np.array(query_labels))
    classes = int(max(bank_y.max(), query_y.max())) + 1
    similarity, index = (query @ bank.t()).topk(min(k, len(bank_y)), dim=1)
    votes = torch.zeros(len(query_y), classes).scatter_add_(1, bank_y[index], torch.exp(similarity / KNN_TEMPERATURE))
    return float((votes.argmax(dim=1) == query_y).float().mean())
