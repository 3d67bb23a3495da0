"""SwAV settings: does the ``swav`` task's tiny backbone learn shape on the built-in images, and how fast?

One process, one CPU thread, the task's own loss and k-NN accuracy (``SwAVTask.knn_top1``: 512 held-out images
against 2,048 labelled training images), with the augmentation's colour jitter replaced by the knobs given. It
prints one JSON line: the random backbone's k-NN accuracy, then the loss and k-NN accuracy at each quarter of the
steps. docs/swav.md lists what it measured.

Command: ``.venv/bin/python bench/swav_settings.py NAME 'JSON'``, with the knobs ``opt`` (adam or lars), ``lr``,
``steps``, ``params`` (the task's parameters), ``jit`` (brightness, contrast and saturation factors, [low, high]),
``hue`` (the most a crop's hue turns, radians), ``grey`` and ``pjit`` (how often a crop is made grey, and
jittered), ``gscale`` and ``lscale`` (the crops' area shares). For example (about 3 minutes):
``.venv/bin/python bench/swav_settings.py grey '{"jit": [0.6, 1.4], "hue": 0, "grey": 1.0, "params":
{"prototypes": 16, "queue_length": 512, "queue_starts_after": 20, "freeze_prototypes_steps": 20}, "steps": 1000}'``
"""

import json
import math
import sys
import time

import torch

import swarmhub.worker.tasks.swav as S
from swarmhub.worker.tasks.swav import SwAVTask
from swarmhub.worker.training.lars import Lars

torch.set_num_threads(1)

name, knobs = sys.argv[1], json.loads(sys.argv[2])
lo, hi = knobs.get("jit", [0.2, 1.8])
S.HUE = knobs.get("hue", S.HUE)
S.GREY = knobs.get("grey", S.GREY)
S.COLOUR_JITTER = knobs.get("pjit", S.COLOUR_JITTER)
S.GLOBAL_SCALE = tuple(knobs.get("gscale", S.GLOBAL_SCALE))
S.LOCAL_SCALE = tuple(knobs.get("lscale", S.LOCAL_SCALE))


def random_crops(
    images: torch.Tensor, count: int, size: int, scale: tuple[float, float], generator: torch.Generator
) -> list[torch.Tensor]:
    import torch.nn.functional as F

    n, device = images.shape[0], images.device

    def uniform(a: float, b: float) -> torch.Tensor:
        return (torch.rand(n, generator=generator) * (b - a) + a).to(device)

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
        jitter = (uniform(0.0, 1.0) < S.COLOUR_JITTER).view(n, 1, 1, 1)
        jittered = S.hue_rotate(crop, uniform(-S.HUE, S.HUE)) * uniform(lo, hi).view(n, 1, 1, 1)
        mean = jittered.mean(dim=(1, 2, 3), keepdim=True)
        jittered = (jittered - mean) * uniform(lo, hi).view(n, 1, 1, 1) + mean
        grey = jittered.mean(dim=1, keepdim=True)
        jittered = grey + (jittered - grey) * uniform(lo, hi).view(n, 1, 1, 1)
        crop = torch.where(jitter, jittered, crop).clamp(0.0, 1.0)
        crop = torch.where((uniform(0.0, 1.0) < S.GREY).view(n, 1, 1, 1), crop.mean(dim=1, keepdim=True), crop)
        crops.append(S.normalise(crop.expand(n, 3, size, size)))
    return crops


S.random_crops = random_crops  # type: ignore[assignment]  # the task reads it at each call
task = SwAVTask(knobs.get("params", {}))
torch.manual_seed(0)
model = task.build_model()
dev = torch.device("cpu")
random_knn = task.knn_top1(model, dev)
lr = knobs.get("lr", 1e-3)
opt: torch.optim.Optimizer = (
    Lars(model.parameters(), lr=lr) if knobs.get("opt") == "lars" else torch.optim.Adam(model.parameters(), lr=lr)
)
it = task.batches(1)
t = time.time()
trail = []
steps = knobs.get("steps", 1000)
for s in range(1, steps + 1):
    loss = task.loss(model, next(it), dev)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if s % (steps // 4) == 0:
        trail.append((s, round(loss.item(), 3), round(task.knn_top1(model, dev), 3)))
print(
    json.dumps(
        {
            "name": name,
            "knobs": knobs,
            "random_knn": round(random_knn, 3),
            "trail": trail,
            "ln_k": round(math.log(task.params.prototypes), 3),
            "seconds": round(time.time() - t),
        }
    ),
    flush=True,
)
