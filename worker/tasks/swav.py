"""SwAV (Caron et al., 2020, "Unsupervised Learning of Visual Features by Contrasting Cluster Assignments"):
self-supervised pretraining of a ResNet backbone on unlabelled images, DeDLOC's second workload.

Each image gives two global crops and ``local_crops`` small ones (multi-crop), augmented on the worker; the model
maps every crop to a unit vector and scores it against ``prototypes`` unit vectors. The codes of each global crop
are computed from its scores with Sinkhorn-Knopp (an equal share of the batch per prototype, no gradient), and every
other crop of the image learns to predict them (cross-entropy of its softmax at ``temperature``). Prototypes get no
gradient for the first ``freeze_prototypes_steps`` local steps; once ``queue_starts_after`` steps are done, a small
batch's codes are computed together with the last ``queue_length`` global embeddings of this peer (the queue).

Quality is the backbone's k-nearest-neighbour accuracy: features of a labelled held-out set, each classified by the
votes of its nearest labelled training images (``knn_top1``). The built-in image set is :mod:`.shapes`, drawn on the
spot. The export is the backbone's state dict in torchvision's layout (:mod:`.resnet`).

Not registered as a task yet: with SwAV's colour jitter the tiny backbone falls to the uniform prediction (the loss
settles at ln(prototypes)) within a few hundred steps, with Adam or LARS; crops that are always grey learn shape, but
not yet enough in the demo's time (docs/swav.md, ``bench/swav_settings.py``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swarmhub.common.protocol import OptimizerName
from swarmhub.worker.tasks import Baseline, Evaluation, Task, shapes

if TYPE_CHECKING:  # the server validates parameters without torch; workers import it when they train
    import torch

TRAIN_SEED, HELD_OUT_SEED = 0, 1
HELD_OUT_IMAGES = 512
BANK_IMAGES = 2048  # the labelled training images held-out images are compared with
KNN_NEIGHBOURS, KNN_TEMPERATURE = 20, 0.07
GLOBAL_SCALE, LOCAL_SCALE = (0.35, 1.0), (0.1, 0.35)  # the share of the image a crop covers
COLOUR_JITTER, GREY = 0.8, 0.2  # how often a crop's colours are jittered, and made grey
JITTER = (0.2, 1.8)  # the range of a jittered crop's brightness, contrast and saturation factors (SwAV's 0.8)
HUE = 0.4 * math.pi  # the most a jittered crop's hue turns, radians (a fifth of the circle, as SwAV's 0.2)


class SwAVParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backbone: Literal["tiny", "resnet18", "resnet50"] = Field(
        default="tiny", title="Backbone", description="tiny for CPUs and 32-pixel images; resnet18 or resnet50"
    )
    batch_size: int = Field(default=32, title="Local batch size", ge=2, le=1024, description="Images per local step")
    crop_size: int = Field(default=32, title="Global crop size", ge=16, le=224, description="Pixels, two per image")
    local_crop_size: int = Field(default=16, title="Local crop size", ge=8, le=160, description="Pixels")
    local_crops: int = Field(default=2, title="Local crops", ge=0, le=8, description="Small crops per image")
    feature_dim: int = Field(default=32, title="Feature size", ge=8, le=512, description="Embedding dimension")
    hidden_dim: int = Field(default=128, title="Head width", ge=16, le=4096, description="Projection head width")
    prototypes: int = Field(default=32, title="Prototypes", ge=2, le=10_000, description="Clusters to assign to")
    temperature: float = Field(default=0.1, gt=0.0, le=1.0, description="Softmax temperature of the predictions")
    epsilon: float = Field(default=0.05, gt=0.0, le=1.0, description="Sinkhorn-Knopp's entropy regularisation")
    sinkhorn_iterations: int = Field(default=3, ge=1, le=20)
    freeze_prototypes_steps: int = Field(default=50, ge=0, le=100_000, description="Local steps without")
    queue_length: int = Field(default=256, ge=0, le=65_536, description="Past embeddings used for small batches")
    queue_starts_after: int = Field(default=100, ge=0, le=1_000_000, description="Local steps before the queue")
    images: int = Field(default=4096, ge=256, le=100_000, description="Size of the built-in image set")


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


def random_crops(
    images: torch.Tensor, count: int, size: int, scale: tuple[float, float], generator: torch.Generator
) -> list[torch.Tensor]:
    """``count`` augmented crops of every image (float, 0..1, shape (N, 3, H, W)): a random area share within
    ``scale`` and aspect ratio within 3/4..4/3, resized to ``size`` pixels, flipped half the time, colour-jittered
    (hue turned by up to ``HUE``, brightness, contrast and saturation scaled within ``JITTER``; ``COLOUR_JITTER``
    of the crops) and made grey (``GREY`` of them), then normalised."""
    import torch
    import torch.nn.functional as F

    n, device = images.shape[0], images.device

    def uniform(low: float, high: float) -> torch.Tensor:
        return (torch.rand(n, generator=generator) * (high - low) + low).to(device)

    crops = []
    for _ in range(count):
        area = uniform(*scale)
        ratio = torch.exp(uniform(math.log(3 / 4), math.log(4 / 3)))
        width, height = (area * ratio).sqrt().clamp(max=1.0), (area / ratio).sqrt().clamp(max=1.0)
        flip = torch.where(uniform(0.0, 1.0) < 0.5, -1.0, 1.0)
        theta = torch.zeros(n, 2, 3, device=device)
        theta[:, 0, 0], theta[:, 1, 1] = width * flip, height
        theta[:, 0, 2], theta[:, 1, 2] = uniform(-1, 1) * (1 - width), uniform(-1, 1) * (1 - height)
        grid = F.affine_grid(theta, [n, 3, size, size], align_corners=False)
        crop = F.grid_sample(images, grid, mode="bilinear", padding_mode="reflection", align_corners=False)
        jitter = (uniform(0.0, 1.0) < COLOUR_JITTER).view(n, 1, 1, 1)
        jittered = hue_rotate(crop, uniform(-HUE, HUE)) * uniform(*JITTER).view(n, 1, 1, 1)
        mean = jittered.mean(dim=(1, 2, 3), keepdim=True)
        jittered = (jittered - mean) * uniform(*JITTER).view(n, 1, 1, 1) + mean
        grey = jittered.mean(dim=1, keepdim=True)
        jittered = grey + (jittered - grey) * uniform(*JITTER).view(n, 1, 1, 1)
        crop = torch.where(jitter, jittered, crop).clamp(0.0, 1.0)
        crop = torch.where((uniform(0.0, 1.0) < GREY).view(n, 1, 1, 1), crop.mean(dim=1, keepdim=True), crop)
        crops.append(normalise(crop.expand(n, 3, size, size)))
    return crops


def hue_rotate(images: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Each image's colours turned by its angle (radians) about the grey axis of the RGB cube: its hue changes,
    its brightness does not."""
    import torch

    axis = torch.full((3,), 3**-0.5, device=images.device)
    cross = torch.tensor([[0.0, -1.0, 1.0], [1.0, 0.0, -1.0], [-1.0, 1.0, 0.0]], device=images.device) * 3**-0.5
    cos, sin = angles.cos().view(-1, 1, 1), angles.sin().view(-1, 1, 1)
    rotation = cos * torch.eye(3, device=images.device) + sin * cross + (1 - cos) * torch.outer(axis, axis)
    return torch.einsum("nij,njhw->nihw", rotation, images)


def normalise(images: torch.Tensor) -> torch.Tensor:
    return (images - 0.5) / 0.25


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


class SwAVTask(Task):
    name = "swav"
    title = "SwAV: self-supervised ResNet pretraining on images (built-in shapes)"
    Params = SwAVParams
    params: SwAVParams

    keeps_checkpoints = True  # the checkpoint peer measures the backbone's k-NN accuracy
    proposed_optimizer = OptimizerName.lars
    baseline_label = "predicts every prototype alike; guesses the most frequent shape"

    def __init__(self, params: BaseModel | dict[str, Any] | None = None):
        super().__init__(params)
        self._steps = 0
        self._queue: Any = None  # (2, queue_length, feature_dim), newest first; a peer's own
        self._generator: Any = None

    @property
    def batch_size(self) -> int:
        return self.params.batch_size

    def build_model(self) -> torch.nn.Module:
        return build_model(self.params)

    def batches(self, seed: int) -> Iterator[Any]:
        import numpy as np
        import torch

        images, labels = shapes.draw(self.params.images, TRAIN_SEED)
        images_t = torch.as_tensor(np.array(images))
        rng = np.random.default_rng(seed)
        self._generator = torch.Generator().manual_seed(seed)
        size = self.params.batch_size
        while True:
            order = torch.as_tensor(rng.permutation(len(labels)))
            for start in range(0, len(order) - size + 1, size):
                yield images_t[order[start : start + size]]

    def crops(self, images: torch.Tensor, device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
        p = self.params
        x = images.to(device).float() / 255.0
        return random_crops(x, 2, p.crop_size, GLOBAL_SCALE, generator) + random_crops(
            x, p.local_crops, p.local_crop_size, LOCAL_SCALE, generator
        )

    def swav_loss(self, model: Any, crops: list[torch.Tensor], frozen: bool, queue: torch.Tensor | None) -> Any:
        import torch
        import torch.nn.functional as F

        p = self.params
        batch = crops[0].shape[0]
        z = model.embed(crops)
        weight = model.prototypes.weight
        prototypes = F.normalize(weight, dim=1)
        if frozen:  # a zero gradient, not none: the swarm averages every parameter's gradient
            prototypes = prototypes.detach() + 0.0 * weight
        scores = z @ prototypes.t()
        total = scores.new_zeros(())
        for i in (0, 1):
            own = scores[i * batch : (i + 1) * batch]
            with torch.no_grad():
                joint = own if queue is None else torch.cat([own, queue[i] @ prototypes.t()])
                codes = sinkhorn(joint, p.epsilon, p.sinkhorn_iterations)[:batch]
            for view in range(len(crops)):
                if view != i:
                    log_p = F.log_softmax(scores[view * batch : (view + 1) * batch].float() / p.temperature, dim=1)
                    total = total - (codes * log_p).sum(dim=1).mean() / (len(crops) - 1)
        return total / 2, z[: 2 * batch].detach()

    def loss(self, model: torch.nn.Module, batch: Any, device: torch.device) -> torch.Tensor:
        import torch

        p = self.params
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(0)
        crops = self.crops(batch, device, self._generator)
        queue = self._queue if self._steps >= p.queue_starts_after else None
        if queue is not None and queue.shape[1] < p.queue_length:
            queue = None  # not full yet
        frozen = self._steps < p.freeze_prototypes_steps
        loss, globals_ = self.swav_loss(model, crops, frozen, None if queue is None else queue.to(device))
        if p.queue_length > 0:  # newest first; this peer's own embeddings of its last global crops
            new = globals_.float().cpu().view(2, -1, p.feature_dim)
            self._queue = new if self._queue is None else torch.cat([new, self._queue], dim=1)[:, : p.queue_length]
        self._steps += 1
        return loss

    def features(self, model: Any, images: Any, device: torch.device) -> torch.Tensor:
        """Unit backbone features of uint8 images, in evaluation mode, 256 at a time."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                x = torch.as_tensor(np.array(images))
                parts = [model(normalise(x[i : i + 256].to(device).float() / 255.0)) for i in range(0, len(x), 256)]
                return F.normalize(torch.cat(parts).float(), dim=1)
        finally:
            model.train(was_training)

    def knn_top1(self, model: torch.nn.Module, device: torch.device) -> float:
        """The held-out images' k-nearest-neighbour accuracy against the labelled training images."""
        bank_images, bank_labels = shapes.draw(self.params.images, TRAIN_SEED)
        query_images, query_labels = shapes.draw(HELD_OUT_IMAGES, HELD_OUT_SEED)
        count = min(BANK_IMAGES, len(bank_labels))
        return knn_top1(
            self.features(model, bank_images[:count], device),
            bank_labels[:count],
            self.features(model, query_images, device),
            query_labels,
        )

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> float:
        """The SwAV loss on the held-out images, the same crops every call, prototypes as they are, no queue."""
        import numpy as np
        import torch

        images, _ = shapes.draw(HELD_OUT_IMAGES, HELD_OUT_SEED)
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                crops = self.crops(torch.as_tensor(np.array(images)), device, torch.Generator().manual_seed(0))
                loss, _ = self.swav_loss(model, crops, frozen=False, queue=None)
                return float(loss)
        finally:
            model.train(was_training)

    def measure(self, model: torch.nn.Module, device: torch.device) -> Evaluation:
        return Evaluation(loss=self.evaluate(model, device), top1=self.knn_top1(model, device))

    def baseline(self, shard_paths: Iterable[Path] = ()) -> Baseline:
        """Predicting every prototype alike (the loss is then ln(prototypes) whatever the codes) and guessing the
        most frequent shape of the held-out images."""
        import numpy as np

        counts = np.bincount(shapes.labels(HELD_OUT_IMAGES, HELD_OUT_SEED), minlength=len(shapes.CLASSES))
        shares = np.sort(counts / counts.sum())[::-1]
        return Baseline(
            cross_entropy=math.log(self.params.prototypes),
            top1=float(shares[0]),
            top5=float(shares[:5].sum()),
            labels=int(counts.sum()),
        )

    def export(self, model: torch.nn.Module, folder: Path) -> None:
        """``backbone.pt`` (the backbone's state dict, torchvision's layout without ``fc``) and ``model.pt`` (all)."""
        import json

        import torch

        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.backbone.state_dict(), folder / "backbone.pt")  # type: ignore[union-attr]
        torch.save(model.state_dict(), folder / "model.pt")
        (folder / "backbone.json").write_text(json.dumps({"architecture": self.params.backbone}) + "\n")


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
