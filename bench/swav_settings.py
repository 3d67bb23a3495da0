"""SwAV settings: does the ``swav`` task's tiny backbone learn shape on the built-in images, and how fast?

One process, one CPU thread, the task's own loss and k-NN accuracy (``SwAVTask.knn_top1``: 512 held-out images
against 2,048 labelled training images), with the augmentation's settings (the task module's constants) set from
the knobs given. It prints one JSON line: the random backbone's k-NN accuracy, then the loss and k-NN accuracy at
each quarter of the steps. docs/swav.md lists what it measured.

Command: ``.venv/bin/python bench/swav_settings.py NAME 'JSON'``, with the knobs ``opt`` (adam or lars), ``lr``,
``steps``, ``params`` (the task's parameters), ``jit`` (brightness, contrast and saturation factors, [low, high]),
``hue`` (the most a crop's hue turns, radians), ``grey`` and ``pjit`` (how often a crop is made grey, and
jittered), ``gscale`` and ``lscale`` (the crops' area shares), ``gjit`` (brightness and contrast factors of grey
crops) and ``accumulate`` (local batches per step: a swarm's target batch size over the local one). It trains on
the built-in ``shapes`` image set, prepared as the server prepares it. For example (about 3 minutes):
``.venv/bin/python bench/swav_settings.py grey '{"jit": [0.6, 1.4], "hue": 0, "grey": 1.0, "params":
{"prototypes": 16, "queue_length": 512, "queue_starts_after": 20, "freeze_prototypes_steps": 20}, "steps": 1000}'``
"""

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import torch

import swarmhub.worker.tasks.multicrop as S
from swarmhub.server.corpus.images import prepare_builtin
from swarmhub.worker.tasks.data import LocalCorpus
from swarmhub.worker.tasks.swav import SwAVTask
from swarmhub.worker.training.lars import Lars

torch.set_num_threads(1)

name, knobs = sys.argv[1], json.loads(sys.argv[2])
S.JITTER = tuple(knobs.get("jit", S.JITTER))
S.HUE = knobs.get("hue", S.HUE)
S.GREY = knobs.get("grey", S.GREY)
S.GREY_JITTER = tuple(knobs.get("gjit", S.GREY_JITTER))
S.COLOUR_JITTER = knobs.get("pjit", S.COLOUR_JITTER)
S.GLOBAL_SCALE = tuple(knobs.get("gscale", S.GLOBAL_SCALE))
S.LOCAL_SCALE = tuple(knobs.get("lscale", S.LOCAL_SCALE))
task = SwAVTask(knobs.get("params", {}))
corpus_dir = Path(tempfile.mkdtemp(prefix="swav-settings-")) / "shapes"
prepare_builtin("shapes", corpus_dir)
task.attach(LocalCorpus(corpus_dir))
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
accumulate = knobs.get("accumulate", 1)  # local batches per optimizer step, as a swarm's target batch size
for s in range(1, steps + 1):
    opt.zero_grad()
    for _ in range(accumulate):
        loss = task.loss(model, next(it), dev)
        (loss / accumulate).backward()
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
