"""The parts of the SwAV workload (``swarmhub.worker.tasks.swav``, docs/swav.md): the
built-in shapes, the ResNet backbones in torchvision's layout, LARS, Sinkhorn-Knopp, multi-crop, the SwAV loss and
the k-nearest-neighbour accuracy."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from swarmhub.server.corpus.images import prepare_builtin
from swarmhub.worker.tasks import Baseline, CorpusNotAttached, available_tasks, shapes
from swarmhub.worker.tasks.data import LocalCorpus
from swarmhub.worker.tasks.multicrop import random_crops
from swarmhub.worker.tasks.resnet import build_backbone
from swarmhub.worker.tasks.swav import SwAVTask
from swarmhub.worker.tasks.swav_model import knn_top1, sinkhorn
from swarmhub.worker.training.lars import Lars


def test_the_shapes_are_drawn_the_same_every_time_with_balanced_labels():
    images, labels = shapes.draw(96, seed=5)
    again, labels_again = shapes.draw.__wrapped__(96, 5)  # drawn afresh, not the cached copy
    assert images.shape == (96, 3, 32, 32) and images.dtype == np.uint8
    assert np.array_equal(images, again) and np.array_equal(labels, labels_again)
    assert np.array_equal(labels, shapes.labels(96, 5))
    assert np.bincount(labels, minlength=8).tolist() == [12] * 8
    other, _ = shapes.draw(96, seed=6)
    assert not np.array_equal(images, other)
    # an image has two colours of some contrast, not one flat field
    assert all(images[i].reshape(3, -1).std(axis=1).max() > 20 for i in range(96))


@pytest.mark.parametrize(
    ("name", "parameters", "features"),
    # torchvision's resnet18 and resnet50 hold 11,689,512 and 25,557,032 parameters, their 1,000-class fc layer
    # 513,000 and 2,049,000 of them
    [("resnet18", 11_689_512 - 513_000, 512), ("resnet50", 25_557_032 - 2_049_000, 2048), ("tiny", None, 128)],
)
def test_the_backbones_have_torchvision_s_layout(name: str, parameters: int | None, features: int):
    backbone = build_backbone(name)
    if parameters is not None:
        assert sum(p.numel() for p in backbone.parameters()) == parameters
        keys = backbone.state_dict().keys()
        assert {"conv1.weight", "bn1.running_var", "layer2.0.downsample.0.weight", "layer4.1.bn2.bias"} <= keys
        assert not any(key.startswith("fc.") for key in keys)
    size = 32 if name == "tiny" else 64
    assert backbone(torch.randn(2, 3, size, size)).shape == (2, features)


def test_lars_scales_each_matrix_s_step_by_its_norm_and_leaves_vectors_plain():
    matrix = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # norm 5
    vector = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    optimizer = Lars([matrix, vector], lr=0.5, momentum=0.9, weight_decay=0.1, trust_coefficient=0.01)
    matrix.grad = torch.tensor([[0.0, 2.0]])
    vector.grad = torch.tensor([0.5, -0.5])
    optimizer.step()
    direction = torch.tensor([[0.3, 2.4]])  # the gradient plus 0.1 of the weights
    expected = torch.tensor([[3.0, 4.0]]) - 0.5 * direction * (0.01 * 5.0 / direction.norm())
    assert torch.allclose(matrix.detach(), expected)
    assert torch.allclose(vector.detach(), torch.tensor([0.75, 1.25]))  # no decay, no scale
    matrix.grad = torch.zeros(1, 2)
    before = matrix.detach().clone()
    optimizer.step()  # with no gradient, momentum and weight decay still move it
    assert not torch.allclose(matrix.detach(), before)


def test_sinkhorn_gives_every_prototype_an_equal_share_of_the_batch():
    scores = torch.nn.functional.normalize(torch.randn(64, 16), dim=1)
    codes = sinkhorn(scores, epsilon=0.05, iterations=50)
    assert codes.shape == (64, 16) and not codes.requires_grad
    assert torch.allclose(codes.sum(dim=1), torch.ones(64), atol=1e-4)
    assert torch.allclose(codes.sum(dim=0), torch.full((16,), 64 / 16), atol=1e-2)
    # scores tied everywhere give the uniform code
    assert torch.allclose(sinkhorn(torch.zeros(8, 4), 0.05, 3), torch.full((8, 4), 0.25))


def test_multi_crop_gives_two_global_and_the_local_crops_at_their_sizes():
    images = torch.rand(4, 3, 32, 32)
    crops = random_crops(images, 2, 32, (0.35, 1.0), torch.Generator().manual_seed(0))
    crops += random_crops(images, 3, 16, (0.1, 0.35), torch.Generator().manual_seed(1))
    assert [tuple(c.shape) for c in crops] == [(4, 3, 32, 32)] * 2 + [(4, 3, 16, 16)] * 3
    again = random_crops(images, 2, 32, (0.35, 1.0), torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(crops[:2], again, strict=True))
    assert not torch.equal(crops[0], crops[1])


@pytest.fixture(scope="module")
def shapes_corpus(tmp_path_factory: pytest.TempPathFactory) -> LocalCorpus:
    """The built-in image set, prepared as the server prepares it for an experiment."""
    folder = tmp_path_factory.mktemp("images") / "shapes"
    prepare_builtin("shapes", folder)
    return LocalCorpus(folder)


def attached(params: dict, corpus: LocalCorpus) -> SwAVTask:
    task = SwAVTask(params)
    task.attach(corpus)
    return task


def test_the_task_needs_the_experiment_s_images():
    task = SwAVTask()
    assert SwAVTask.needs_corpus and SwAVTask.corpus_kind == "images"
    with pytest.raises(CorpusNotAttached, match="trains on the experiment's images"):
        next(task.batches(seed=0))


def test_batches_come_from_the_shards_a_worker_takes(shapes_corpus: LocalCorpus):
    task = attached({"batch_size": 100}, shapes_corpus)
    batches = task.batches(seed=1)
    seen = [next(batches) for _ in range(12)]  # 1,200 images: past the first 512-image shard and its leftover
    assert all(b.shape == (100, 3, 32, 32) and b.dtype == torch.uint8 for b in seen)
    training = {bytes(image) for image in np.load(shapes_corpus.folder / "shard-00000.npy")}
    for name in ("shard-00001.npy", "shard-00002.npy", "shard-00003.npy"):
        training |= {bytes(image) for image in np.load(shapes_corpus.folder / name)}
    drawn = [bytes(image.numpy()) for b in seen for image in b]
    assert len(set(drawn)) == len(drawn)  # no image twice before every image of its shards was seen
    held_out = {bytes(image) for image in np.load(shapes_corpus.folder / "eval.npy")}
    assert not held_out & set(drawn)


def test_the_swav_loss_reaches_every_parameter_but_frozen_prototypes(shapes_corpus: LocalCorpus):
    params = {"batch_size": 8, "prototypes": 10, "queue_length": 16, "queue_starts_after": 2}
    task = attached(params, shapes_corpus)
    torch.manual_seed(0)
    model = task.build_model()
    batches = task.batches(seed=3)
    for step in range(4):  # prototypes frozen for 50 steps by default; the queue is used from the third step
        model.zero_grad()
        loss = task.loss(model, next(batches), torch.device("cpu"))
        assert math.isfinite(loss.item())
        loss.backward()
        assert all(p.grad is not None for p in model.parameters())
        assert torch.count_nonzero(model.prototypes.weight.grad) == 0
        assert model.backbone.conv1.weight.grad.abs().sum() > 0
    assert task._queue.shape == (2, 16, task.params.feature_dim)
    unfrozen = attached({"batch_size": 8, "prototypes": 10, "freeze_prototypes_steps": 0}, shapes_corpus)
    model.zero_grad()
    unfrozen.loss(model, next(batches), torch.device("cpu")).backward()
    assert model.prototypes.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("colour", ["jitter", "grey"])
def test_the_held_out_measures_are_the_same_twice_and_the_baseline_is_a_random_backbone(
    shapes_corpus: LocalCorpus, colour: str
):
    task = attached({"prototypes": 12, "colour": colour}, shapes_corpus)
    torch.manual_seed(0)
    model = task.build_model()
    first = task.measure(model, torch.device("cpu"))
    assert first == task.measure(model, torch.device("cpu"))
    assert 0.0 <= first.top1 <= 1.0 and first.loss > 0
    baseline = task.baseline()
    assert baseline.labels == 512 and baseline.top1 == pytest.approx(first.top1)  # seed 0: the same random backbone
    assert baseline.cross_entropy == pytest.approx(first.loss)


def test_a_process_without_torch_measures_the_baseline_in_a_child(shapes_corpus: LocalCorpus):
    code = (
        "import sys; from pathlib import Path\n"
        "from swarmhub.worker.tasks.data import LocalCorpus\n"
        "from swarmhub.worker.tasks.swav import SwAVTask\n"
        "task = SwAVTask({'prototypes': 12}); task.attach(LocalCorpus(Path(sys.argv[1])))\n"
        "found = task.baseline()\n"
        "assert 'torch' not in sys.modules, 'the baseline loaded torch here'\n"
        "print(found.model_dump_json())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(shapes_corpus.folder)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    in_child = Baseline.model_validate_json(done.stdout.strip())
    here = attached({"prototypes": 12}, shapes_corpus).baseline()
    assert in_child == here


def test_grey_crops_and_grey_evaluation_drop_the_colours():
    images = torch.rand(4, 3, 32, 32)
    for crop in random_crops(images, 2, 32, (0.35, 1.0), torch.Generator().manual_seed(0), grey=True):
        assert torch.equal(crop[:, 0], crop[:, 1]) and torch.equal(crop[:, 1], crop[:, 2])
    task = SwAVTask({"colour": "grey"})
    prepared = task._prepared((torch.rand(2, 3, 8, 8) * 255).to(torch.uint8))
    assert torch.equal(prepared[:, 0], prepared[:, 2])


def test_an_unlabelled_corpus_has_a_held_out_loss_and_no_accuracy(shapes_corpus: LocalCorpus, tmp_path: Path):
    folder = tmp_path / "unlabelled"
    shutil.copytree(shapes_corpus.folder, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"] = {}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    task = attached({"prototypes": 12}, LocalCorpus(folder))
    torch.manual_seed(0)
    measured = task.measure(task.build_model(), torch.device("cpu"))
    assert measured.top1 is None and measured.loss > 0
    assert task.baseline() is None


def test_the_swarm_state_carries_batch_norm_statistics():
    task = SwAVTask()
    model = task.build_model()
    extras = task.extra_tensors(model)
    means = [m.running_mean for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert means and all(any(e is m for e in extras) for m in means)
    assert all(e.is_floating_point() for e in extras)  # the step counters stay each peer's own


def test_knn_accuracy_counts_the_neighbours_votes():
    bank = torch.nn.functional.normalize(torch.randn(40, 8), dim=1)
    labels = np.arange(40) % 4
    assert knn_top1(bank, labels, bank, labels, k=1) == 1.0
    # each query's nearest bank feature is its own: right with its label, wrong with every label moved one on
    queries = torch.nn.functional.normalize(bank + 0.01 * torch.randn(40, 8), dim=1)
    assert knn_top1(bank, labels, queries, labels, k=1) == 1.0
    assert knn_top1(bank, labels, queries, np.roll(labels, 1), k=1) == 0.0


def test_swav_is_offered_to_organizers():
    assert "swav" in available_tasks()


def test_the_worker_trains_with_lars() -> None:
    from swarmhub.common.protocol import OptimizerName, TrainingSettings
    from swarmhub.worker.training.peer import optimizer_factory

    settings = TrainingSettings.model_validate({"optimizer": "lars", "learning_rate": 0.3})
    assert settings.optimizer is OptimizerName.lars
    opt = optimizer_factory(settings)([torch.nn.Parameter(torch.ones(2, 2))])
    assert isinstance(opt, Lars) and opt.param_groups[0]["lr"] == pytest.approx(0.3)


def test_the_rate_falls_along_a_cosine_to_a_tenth_and_stays():
    assert SwAVTask().lr_schedule() is None
    schedule = SwAVTask({"decay_steps": 100}).lr_schedule()
    assert schedule is not None
    assert schedule(0) == pytest.approx(1.0) and schedule(50) == pytest.approx(0.55)
    assert schedule(100) == pytest.approx(0.1) and schedule(10_000) == pytest.approx(0.1)
