"""SwAV (Caron et al., 2020, "Unsupervised Learning of Visual Features by Contrasting Cluster Assignments"):
self-supervised pretraining of a ResNet backbone on unlabelled images, DeDLOC's second workload.

Each image gives two global crops and ``local_crops`` small ones (multi-crop), augmented on the worker; the model
maps every crop to a unit vector and scores it against ``prototypes`` unit vectors. The codes of each global crop
are computed from its scores with Sinkhorn-Knopp (an equal share of the batch per prototype, no gradient), and every
other crop of the image learns to predict them (cross-entropy of its softmax at ``temperature``). Prototypes get no
gradient for the first ``freeze_prototypes_steps`` local steps; once ``queue_starts_after`` steps are done, a small
batch's codes are computed together with the last ``queue_length`` global embeddings of this peer (the queue).

The images are the experiment's (an organizer's archive, or the built-in :mod:`.shapes`), cut into shards by the
server (``server/corpus/images.py``). Quality is the backbone's k-nearest-neighbour accuracy: features of the
corpus's labelled held-out images, each classified by the votes of its nearest labelled training images (the
bank). The network, Sinkhorn-Knopp and the k-NN vote are in :mod:`.swav_model`, the crops in :mod:`.multicrop`. The
export is the backbone's state dict in torchvision's layout (:mod:`.resnet`). With SwAV's colour jitter the tiny
backbone falls to the uniform prediction on the shapes; ``colour: "grey"`` learns shape (docs/swav.md).
"""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from swarmhub.common.protocol import OptimizerName
from swarmhub.worker.tasks import Baseline, CorpusNotAttached, Evaluation, Task, TaskData
from swarmhub.worker.tasks.multicrop import GLOBAL_SCALE, LOCAL_SCALE, luminance, normalise, random_crops
from swarmhub.worker.tasks.swav_model import build_model, knn_top1, sinkhorn

if TYPE_CHECKING:  # the server validates parameters without torch; workers import it when they train
    import torch

HELD_OUT_IMAGES = 512  # the most the held-out loss is measured on
FINAL_RATE_SHARE = 0.1  # of the learning rate, where the decay ends
BASELINE_SECONDS = 300  # the most measuring a random backbone may take (seconds on a CPU for the tiny one)


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
    temperature: float = Field(
        default=0.1, title="Temperature", gt=0.0, le=1.0, description="Softmax temperature of the predictions"
    )
    epsilon: float = Field(
        default=0.05, title="Sinkhorn epsilon", gt=0.0, le=1.0, description="Entropy regularisation of the codes"
    )
    sinkhorn_iterations: int = Field(default=3, title="Sinkhorn iterations", ge=1, le=20)
    freeze_prototypes_steps: int = Field(
        default=50, title="Frozen prototypes", ge=0, le=100_000, description="Local steps before prototypes learn"
    )
    queue_length: int = Field(
        default=256, title="Queue length", ge=0, le=65_536, description="Past embeddings used for small batches"
    )
    queue_starts_after: int = Field(
        default=100, title="Queue starts after", ge=0, le=1_000_000, description="Local steps before the queue"
    )
    decay_steps: int = Field(
        default=0,
        title="Decay steps",
        ge=0,
        le=10_000_000,
        description="Collaborative steps over which the rate falls (cosine) to a tenth, then stays; 0 keeps it",
    )
    colour: Literal["jitter", "grey"] = Field(
        default="jitter",
        title="Colour",
        description="jitter: the colour jitter of SwAV and an occasional grey crop; grey: every crop and evaluated "
        "image grey, with gentle brightness and contrast jitter (for images whose colours say nothing of their kind)",
    )


class SwAVTask(Task):
    name = "swav"
    title = "SwAV: self-supervised ResNet pretraining on images"
    Params = SwAVParams
    params: SwAVParams

    keeps_checkpoints = True  # the checkpoint peer measures the backbone's k-NN accuracy
    needs_corpus = True
    corpus_kind = "images"
    proposed_optimizer = OptimizerName.lars
    baseline_label = "is a randomly initialised backbone"
    held_out_words = "labelled images no worker trains on"
    accuracy_words = (
        "k-nearest-neighbour accuracy of the backbone's features: each held-out image takes the weighted vote of "
        "the 20 most similar labelled training images"
    )
    download_words = (
        "the backbone's state dict (backbone.pt, torchvision's layout, architecture in backbone.json): "
        "resnet18/resnet50 load into torchvision.models.resnet18()/resnet50() once their fc is torch.nn.Identity(); "
        "tiny is swarmhub.worker.tasks.resnet.build_backbone('tiny')"
    )

    def __init__(self, params: BaseModel | dict[str, Any] | None = None):
        super().__init__(params)
        self._steps = 0
        self._queue: Any = None  # (2, queue_length, feature_dim), newest first; a peer's own
        self._generator: Any = None
        self._held_out: Any = None
        self._read: dict[str, tuple[Any, Any] | None] = {}  # the labelled sets, read once per attached corpus

    @property
    def batch_size(self) -> int:
        return self.params.batch_size

    def build_model(self) -> torch.nn.Module:
        return build_model(self.params)

    def lr_schedule(self) -> Callable[[int], float] | None:
        """The full rate at the first collaborative step, falling along a half cosine to ``FINAL_RATE_SHARE`` of it
        at ``decay_steps``, then held there (a backbone that keeps training, with less of the noise of a large
        rate); None where ``decay_steps`` is 0."""
        total = self.params.decay_steps
        if total == 0:
            return None

        def multiplier(step: int) -> float:
            done = min(step, total) / total
            return FINAL_RATE_SHARE + (1.0 - FINAL_RATE_SHARE) * 0.5 * (1.0 + math.cos(math.pi * done))

        return multiplier

    def attach(self, data: TaskData) -> None:
        super().attach(data)
        self._held_out = None
        self._read = {}

    def _corpus(self) -> TaskData:
        if self.data is None:
            raise CorpusNotAttached(
                "The swav task trains on the experiment's images: call attach(corpus) before reading batches"
            )
        return self.data

    def _labelled(self, name: str) -> tuple[Any, Any] | None:
        """``eval`` or ``bank``: the corpus's labelled images and their labels, or None for an unlabelled corpus
        (read once: the checkpoint peer measures every checkpoint on them)."""
        from swarmhub.worker.tasks.data import load_images, load_labels

        if name in self._read:
            return self._read[name]
        corpus = self._corpus()
        found = None
        if f"{name}.npy" in corpus.manifest.get("files", {}):
            images = load_images(corpus.file(f"{name}.npy"))
            labels = load_labels(corpus.file(f"{name}_labels.npy"))
            if len(labels) != len(images):
                raise CorpusNotAttached(f"the corpus's {name}.npy and {name}_labels.npy differ in length")
            found = images, labels
        self._read[name] = found
        return found

    def _held_out_images(self) -> Any:
        """The held-out images the loss is measured on (the same every call): the labelled held-out set, or, for a
        corpus without labels (which has no held-out images), ``HELD_OUT_IMAGES`` of one training shard."""
        from swarmhub.worker.tasks.data import load_images

        if self._held_out is None:
            labelled = self._labelled("eval")
            if labelled is not None:
                self._held_out = labelled[0][:HELD_OUT_IMAGES]
            else:
                first = next(iter(self._corpus().shards(0)))  # the same shard every time
                self._held_out = load_images(first)[:HELD_OUT_IMAGES]
        return self._held_out

    def batches(self, seed: int) -> Iterator[Any]:
        """Batches of uint8 images from the shards this worker takes, shuffled within each shard; a shard's
        last images that do not fill a batch wait for the next shard's."""
        import numpy as np
        import torch

        from swarmhub.worker.tasks.data import load_images

        rng = np.random.default_rng(seed)
        self._generator = torch.Generator().manual_seed(seed)
        size = self.params.batch_size
        carry = None
        for path in self._corpus().shards(seed):
            images = load_images(path)
            images = images[rng.permutation(len(images))]
            if carry is not None:
                images = np.concatenate([carry, images])
            whole = len(images) - len(images) % size
            for start in range(0, whole, size):
                yield torch.as_tensor(images[start : start + size])
            carry = images[whole:]

    def crops(self, images: torch.Tensor, device: torch.device, generator: torch.Generator) -> list[torch.Tensor]:
        p = self.params
        x = images.to(device).float() / 255.0
        grey = p.colour == "grey"
        return random_crops(x, 2, p.crop_size, GLOBAL_SCALE, generator, grey) + random_crops(
            x, p.local_crops, p.local_crop_size, LOCAL_SCALE, generator, grey
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
        """Unit backbone features of uint8 images (grey ones where the task's colour is grey), in evaluation mode,
        256 at a time."""
        import numpy as np
        import torch
        import torch.nn.functional as F

        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                x = torch.as_tensor(np.array(images))
                parts = [
                    model(self._prepared(x[i : i + 256].to(device).float() / 255.0)) for i in range(0, len(x), 256)
                ]
                return F.normalize(torch.cat(parts).float(), dim=1)
        finally:
            model.train(was_training)

    def _prepared(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 images as the backbone sees them in evaluation: 0..1, grey where the task's colour is, normalised."""
        images = images.float() / 255.0
        if self.params.colour == "grey":
            images = luminance(images).expand_as(images)
        return normalise(images)

    def knn_top1(self, model: torch.nn.Module, device: torch.device) -> float | None:
        """The held-out images' k-nearest-neighbour accuracy against the labelled training images (the bank), or
        None for a corpus without labels."""
        queries, bank = self._labelled("eval"), self._labelled("bank")
        if queries is None or bank is None:
            return None
        return knn_top1(
            self.features(model, bank[0], device), bank[1], self.features(model, queries[0], device), queries[1]
        )

    def evaluate(self, model: torch.nn.Module, device: torch.device) -> float:
        """The SwAV loss on the held-out images, the same crops every call, prototypes as they are, no queue."""
        import numpy as np
        import torch

        images = self._held_out_images()
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                crops = self.crops(torch.as_tensor(np.array(images)), device, torch.Generator().manual_seed(0))
                loss, _ = self.swav_loss(model, crops, frozen=False, queue=None)
                return float(loss)
        finally:
            model.train(was_training)

    def measure(self, model: torch.nn.Module, device: torch.device) -> Evaluation:  # type: ignore[override]
        return Evaluation(loss=self.evaluate(model, device), top1=self.knn_top1(model, device))

    def baseline(self, shard_paths: Iterable[Path] = ()) -> Baseline | None:
        """A randomly initialised backbone (seed 0) measured as the checkpoint peer measures the swarm's: its
        held-out SwAV loss and k-NN accuracy; None for a corpus without labels. Measured in a child process where
        this one has not loaded torch (the web process, which prepares the corpus, never does)."""
        if self.data is None or self._labelled("eval") is None:
            return None
        if "torch" in sys.modules:
            return self.random_backbone()
        folder = getattr(self.data, "folder", None)
        if folder is None:
            return None
        command = [sys.executable, "-m", "swarmhub.worker.tasks.swav", str(folder), self.params.model_dump_json()]
        done = subprocess.run(command, capture_output=True, text=True, timeout=BASELINE_SECONDS, check=False)
        if done.returncode != 0:
            raise CorpusNotAttached(f"measuring a random backbone on the corpus failed: {done.stderr[-400:]}")
        return Baseline.model_validate_json(done.stdout.strip().splitlines()[-1])

    def random_backbone(self) -> Baseline:
        import torch

        queries = self._labelled("eval")
        assert queries is not None
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = self.build_model()
        measured = self.measure(model, torch.device("cpu"))
        return Baseline(cross_entropy=measured.loss, top1=measured.top1 or 0.0, labels=len(queries[1]))

    def export(self, model: torch.nn.Module, folder: Path) -> None:
        """``backbone.pt`` (the backbone's state dict, torchvision's layout without ``fc``) and ``model.pt`` (all)."""
        import json

        import torch

        folder.mkdir(parents=True, exist_ok=True)
        torch.save(model.backbone.state_dict(), folder / "backbone.pt")  # type: ignore[union-attr]
        torch.save(model.state_dict(), folder / "model.pt")
        (folder / "backbone.json").write_text(json.dumps({"architecture": self.params.backbone}) + "\n")


if __name__ == "__main__":  # the random backbone's baseline, for a process without torch: FOLDER PARAMS_JSON
    from swarmhub.worker.tasks.data import LocalCorpus

    task = SwAVTask(SwAVParams.model_validate_json(sys.argv[2]))
    task.attach(LocalCorpus(Path(sys.argv[1])))
    print(task.random_backbone().model_dump_json())
