"""An image corpus as the server prepares it from real archives made here with Pillow (``server/corpus/images.py``),
and as workers read it (``worker/tasks/data.py``): the manifest's contract, the resize, the held-out split, every
kind of archive and the built-in shapes. Uploads through the HTTP API and the page, and every refusal of a bad archive,
are in ``tests/test_image_uploads.py``."""

from __future__ import annotations

import hashlib
import io
import json
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from swarmhub.server.corpus import images
from swarmhub.server.corpus.upload import CorpusError
from swarmhub.worker.tasks import shapes
from swarmhub.worker.tasks.data import CorpusUnavailable, LocalCorpus, RemoteCorpus, load_images, load_labels

from .image_archives import colour_of, image_file, labels_csv, solid_images, tar_of, zip_of

CLASSES = ("apple", "banana", "cherry")


def labelled_archive(count: int = 120, labelled: int = 40) -> tuple[dict[str, bytes], dict[str, str]]:
    """``count`` solid images (one colour each) in varied formats, the first ``labelled`` of them in labels.csv,
    and the clutter archivers add; returns the members and each labelled path's label."""
    members = solid_images(count, formats=("PNG", "WEBP", "BMP", "GIF"))
    paths = list(members)
    labels = {paths[i]: CLASSES[i % 3] for i in range(labelled)}
    members["labels.csv"] = labels_csv(list(labels.items()))
    members["README.txt"] = b"our lab's images\n"
    members[".DS_Store"] = b"\0\0\0\1Bud1"
    members["__MACOSX/images/._0000.png"] = b"\0\5\26\7"
    return members, labels


def colours(array: np.ndarray) -> list[tuple[int, int, int]]:
    """The one colour of each image of a (n, 3, s, s) array, asserting that it is one colour."""
    found = []
    for image in array:
        first = tuple(int(c) for c in image[:, 0, 0])
        assert (image == np.asarray(first, dtype=np.uint8)[:, None, None]).all(), "an image is not one colour"
        found.append(first)
    return found


def prepared(tmp_path: Path, archive: bytes, **options) -> tuple[dict, Path]:
    folder = tmp_path / "corpora" / "run"
    return images.prepare(io.BytesIO(archive), folder, **options), folder


def test_a_labelled_archive_becomes_the_manifest_workers_read_with_held_out_images_in_no_shard(tmp_path):
    members, labels = labelled_archive()
    manifest, folder = prepared(tmp_path, zip_of(members), image_size=16, shard_images=32, source="upload:lab.zip")

    assert manifest == json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "images" and manifest["format"] == 1 and manifest["source"] == "upload:lab.zip"
    assert manifest["image_size"] == 16 and manifest["classes"] == list(CLASSES)
    assert (manifest["eval_images"], manifest["bank_images"], manifest["images"]) == (10, 30, 110)
    assert manifest["skipped"] == 1  # README.txt; .DS_Store and __MACOSX are clutter, not counted
    assert set(manifest["files"]) == {"eval.npy", "eval_labels.npy", "bank.npy", "bank_labels.npy"}
    assert [s["name"] for s in manifest["shards"]] == [f"shard-{i:05d}.npy" for i in range(4)]
    assert [s["images"] for s in manifest["shards"]] == [32, 32, 32, 14]
    for name, facts in [*manifest["files"].items(), *((s["name"], s) for s in manifest["shards"])]:
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == facts["sha256"], name
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["manifest.json", *manifest["files"]] + [s["name"] for s in manifest["shards"]]
    )

    train = np.concatenate([load_images(folder / s["name"]) for s in manifest["shards"]])
    assert train.dtype == np.uint8 and train.shape == (110, 3, 16, 16)
    queries, bank = load_images(folder / "eval.npy"), load_images(folder / "bank.npy")
    query_labels, bank_labels = load_labels(folder / "eval_labels.npy"), load_labels(folder / "bank_labels.npy")
    label_of = {colour_of(int(Path(p).stem)): CLASSES.index(label) for p, label in labels.items()}
    # Every image is in the training shards or held out, never both; the bank is labelled training images.
    trained, held_out = colours(train), colours(queries)
    assert sorted(trained + held_out) == sorted(colour_of(i) for i in range(120))
    assert not set(trained) & set(held_out)
    assert set(colours(bank)) <= set(trained) and len(set(colours(bank)) | set(held_out)) == 40
    assert [label_of[c] for c in held_out] == query_labels.tolist()
    assert [label_of[c] for c in colours(bank)] == bank_labels.tolist()
    assert trained != sorted(trained)  # shuffled: a shard of one folder (or one class) would train badly


def test_the_centre_square_is_kept_and_a_solid_colour_survives_the_resize(tmp_path):
    members = solid_images(64)
    bands = np.zeros((100, 300, 3), np.uint8)  # red | green | blue: the centre square is the green third
    bands[:, :100], bands[:, 100:200], bands[:, 200:] = (255, 0, 0), (0, 255, 0), (0, 0, 255)
    buffer = io.BytesIO()
    Image.fromarray(bands).save(buffer, "PNG")
    members["wide.png"] = buffer.getvalue()
    members["big.png"] = image_file((10, 200, 30), (200, 120))
    members["photo.jpg"] = image_file((200, 60, 90), (256, 64), "JPEG")
    manifest, folder = prepared(tmp_path, zip_of(members), image_size=32)

    train = np.concatenate([load_images(folder / s["name"]) for s in manifest["shards"]])
    assert train.shape == (67, 3, 32, 32)
    by_centre = {tuple(int(c) for c in image[:, 16, 16]): image for image in train}
    green = by_centre[(0, 255, 0)]
    assert (green[:, :, 1:-1] == np.array([0, 255, 0], np.uint8)[:, None, None]).all()
    assert (green[1] > 200).all() and (green[0] < 40).all() and (green[2] < 40).all()  # resampling at the edges
    assert (by_centre[(10, 200, 30)] == np.array([10, 200, 30], np.uint8)[:, None, None]).all()
    photo = next(image for centre, image in by_centre.items() if abs(centre[0] - 200) < 6 and centre[1] < 70)
    assert np.abs(photo.astype(int) - np.array([200, 60, 90])[:, None, None]).max() <= 6  # JPEG is lossy


@pytest.mark.parametrize("mode", ["w", "w:gz", "w:bz2", "w:xz"])
def test_a_tar_archive_gives_the_same_corpus_as_a_zip(tmp_path, mode):
    members, _ = labelled_archive(80, 16)
    from_zip, _ = prepared(tmp_path / "zip", zip_of(members), image_size=16)
    from_tar, _ = prepared(tmp_path / "tar", tar_of(members, mode), image_size=16)
    for key in ("sha256", "files", "shards", "classes", "images", "eval_images", "bank_images"):
        assert from_tar[key] == from_zip[key], key


def test_an_archive_without_labels_trains_on_every_image(tmp_path):
    manifest, folder = prepared(tmp_path, tar_of(solid_images(70, folder="a/b/c")), image_size=16)
    assert manifest["files"] == {} and manifest["classes"] == [] and manifest["images"] == 70
    assert (manifest["eval_images"], manifest["bank_images"]) == (0, 0)
    train = np.concatenate([load_images(folder / s["name"]) for s in manifest["shards"]])
    assert sorted(colours(train)) == sorted(colour_of(i) for i in range(70))


def test_the_builtin_shapes_are_the_tasks_own_images_in_seconds(tmp_path):
    started = time.monotonic()
    manifest = images.prepare_builtin("shapes", tmp_path / "shapes")
    took = time.monotonic() - started
    folder = tmp_path / "shapes"
    drawn, kinds = shapes.draw(4096, 0)
    queries, query_kinds = shapes.draw(512, 1)
    assert manifest["source"] == "builtin:shapes" and manifest["classes"] == list(shapes.CLASSES)
    assert (manifest["images"], manifest["eval_images"], manifest["bank_images"]) == (4096, 512, 2048)
    assert [s["images"] for s in manifest["shards"]] == [512] * 8
    train = np.concatenate([load_images(folder / s["name"]) for s in manifest["shards"]])
    assert np.array_equal(train, drawn)
    assert np.array_equal(load_images(folder / "bank.npy"), drawn[:2048])
    assert np.array_equal(load_labels(folder / "bank_labels.npy"), kinds[:2048])
    assert np.array_equal(load_images(folder / "eval.npy"), queries)
    assert np.array_equal(load_labels(folder / "eval_labels.npy"), query_kinds)
    assert took < 30, took  # `swarmhub demo --experiment demo-swav` prepares it at start-up (about a second here)
    with pytest.raises(CorpusError, match="drawn at 32 pixels") as refused:
        images.prepare_builtin("shapes", tmp_path / "other", image_size=64)
    assert refused.value.field == "image_size"


def test_workers_load_only_plain_arrays_of_square_rgb_images_and_labels(tmp_path):
    def saved(name: str, array: np.ndarray, pickle: bool = False) -> Path:
        np.save(tmp_path / name, array, allow_pickle=pickle)
        return tmp_path / name

    good = load_images(saved("ok.npy", np.zeros((2, 3, 8, 8), np.uint8)))
    assert good.shape == (2, 3, 8, 8)
    for name, array in {
        "tokens.npy": np.zeros((2, 64), np.int32),
        "floats.npy": np.zeros((2, 3, 8, 8), np.float32),
        "rgba.npy": np.zeros((2, 4, 8, 8), np.uint8),
        "wide.npy": np.zeros((2, 3, 8, 9), np.uint8),
    }.items():
        with pytest.raises(CorpusUnavailable, match="square RGB images"):
            load_images(saved(name, array))
    with pytest.raises(CorpusUnavailable, match="not a plain numpy array"):
        load_images(saved("objects.npy", np.array([{"x": 1}], dtype=object), pickle=True))
    assert load_labels(saved("labels.npy", np.array([0, 2, 1], np.int64))).tolist() == [0, 2, 1]
    for name, array in {"f.npy": np.zeros(3, np.float64), "2d.npy": np.zeros((3, 1), np.int64)}.items():
        with pytest.raises(CorpusUnavailable, match="not an array of labels"):
            load_labels(saved(name, array))
    with pytest.raises(CorpusUnavailable, match="not an array of labels"):
        load_labels(saved("negative.npy", np.array([0, -1], np.int64)))


def test_a_volunteer_downloads_checks_and_caches_an_image_corpus(tmp_path):
    members, _ = labelled_archive(80, 16)
    manifest, folder = prepared(tmp_path / "server", zip_of(members), image_size=16, shard_images=16)
    other, _ = prepared(tmp_path / "other", zip_of(solid_images(70)), image_size=16)
    asked: list[str] = []
    served = {
        name: (folder / name).read_bytes() for name in [*manifest["files"], *(s["name"] for s in manifest["shards"])]
    }

    def get(name: str) -> bytes:  # what the server's data route answers
        asked.append(name)
        return served[name]

    cache = tmp_path / "cache"
    turns = iter(range(100))
    corpus = RemoteCorpus(manifest, cache, get, lambda: next(turns) % len(manifest["shards"]))
    assert corpus.folder.name == manifest["sha256"][:16] != other["sha256"][:16]
    shards = corpus.shards(seed=0)
    for shard in manifest["shards"]:
        path = next(shards)
        assert path.name == shard["name"] and load_images(path).shape == (shard["images"], 3, 16, 16)
    assert np.array_equal(load_labels(corpus.file("eval_labels.npy")), np.load(folder / "eval_labels.npy"))
    again = RemoteCorpus(manifest, cache, get, lambda: 0)  # a restart: from the cache, nothing downloaded twice
    before = len(asked)
    assert load_images(next(again.shards(seed=0))).shape[0] == 16 and len(asked) == before
    local = LocalCorpus(folder)
    assert local.manifest == manifest and load_images(local.file("bank.npy")).shape == (12, 3, 16, 16)

    served["shard-00001.npy"] = served["shard-00001.npy"][:-1] + b"\1"  # a shard changed on the way
    tampered = RemoteCorpus(manifest, tmp_path / "cache2", get, lambda: 1)
    with pytest.raises(CorpusUnavailable, match="does not match its manifest"):
        next(tampered.shards(seed=0))
