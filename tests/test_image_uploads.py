"""Images as an experiment's data through the real HTTP API and page (``swav``, a task whose corpus is images):
an uploaded archive or the built-in shapes, each bad archive refused with a 4xx naming the field and what to do while
the experiment's corpus stays as it was, volunteers served and handed shards as for text, and text and image tasks
each refusing the other's data. How the archive becomes shards is in ``tests/test_image_corpus.py``."""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np
import pytest
from sqlalchemy import select

from swarmhub.server.models import Corpus, Experiment
from swarmhub.worker.tasks import get_task
from swarmhub.worker.tasks.data import load_images

from .conftest import api_token, csrf_from, login, make_experiment, make_user
from .image_archives import BAD_ARCHIVES, labels_csv, solid_images, tar_of, zip_of
from .support import SMALL, corpora_on_disk, inline_errors


@pytest.fixture
def organizer(client, db):
    """Alice (an administrator: the first account) with a draft ``swav`` experiment, and her API headers."""
    alice = make_user(db)
    make_experiment(db, alice, slug="swav-run", task="swav", task_params={})
    return api_token(client)


def put(client, headers, data: bytes | None = None, name="images.zip", slug="swav-run", **form):
    files = {"file": (name, data, "application/octet-stream")} if data is not None else None
    return client.put(f"/api/experiments/{slug}/corpus", headers=headers, files=files, data=form)


def labelled_zip(count: int = 100, labelled: int = 40) -> bytes:
    members = solid_images(count)
    rows = [(path, ("cat", "dog")[i % 2]) for i, path in enumerate(list(members)[:labelled])]
    return zip_of({**members, "labels.csv": labels_csv(rows)})


def row_of(db, slug: str) -> Corpus | None:
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == slug))
        return session.get(Corpus, experiment.id)


def test_the_swav_task_takes_images():
    assert get_task("swav").needs_corpus and get_task("swav").corpus_kind == "images"
    assert get_task("albert-mlm").corpus_kind == "text"


def test_an_uploaded_archive_is_prepared_and_served_to_volunteers(client, db, settings, organizer):
    response = put(client, organizer, labelled_zip(), name="lab images.zip", image_size="24")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["kind"] == "images" and body["source"] == "upload:lab images.zip"
    assert (body["image_size"], body["images"], body["eval_images"], body["classes"]) == (24, 90, 10, 2)
    assert body["shards"] == 1 and body["bytes"] > 100 * 3 * 24 * 24
    assert client.get("/api/experiments/swav-run/corpus", headers=organizer).json() == body
    (folder,) = corpora_on_disk(settings)

    started = client.post("/api/experiments/swav-run/status", headers=organizer, json={"action": "start"})
    assert started.status_code == 200, started.text
    make_user(db, "bob")
    bob = api_token(client, "bob")
    manifest = client.get("/api/experiments/swav-run/data/manifest", headers=bob).json()
    assert manifest == json.loads((folder / "manifest.json").read_text())
    assert manifest["kind"] == "images" and manifest["image_size"] == 24 and manifest["classes"] == ["cat", "dog"]
    for name, facts in [*manifest["files"].items(), *((s["name"], s) for s in manifest["shards"])]:
        got = client.get(f"/api/experiments/swav-run/data/files/{name}", headers=bob)
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == facts["sha256"], name
    shard = np.load(io.BytesIO(client.get("/api/experiments/swav-run/data/files/shard-00000.npy", headers=bob).content))
    assert shard.shape == (90, 3, 24, 24) and shard.dtype == np.uint8
    for bad in ("../../swarmhub.db", "manifest.json", "shard-00001.npy", "%2e%2e/secret"):
        assert client.get(f"/api/experiments/swav-run/data/files/{bad}", headers=bob).status_code == 404, bad


def test_the_builtin_shapes_and_the_sources_each_kind_of_task_is_offered(client, db, settings, organizer):
    make_experiment(db, make_user(db, "carol"), slug="albert-run", task="albert-mlm", task_params={"size": "tiny"})
    texts = client.get("/api/corpus-sources", headers=organizer).json()
    assert [s["name"] for s in client.get("/api/corpus-sources?task=albert-mlm", headers=organizer).json()] == [
        s["name"] for s in texts
    ]
    assert "builtin:shapes" not in [s["name"] for s in texts]
    offered = client.get("/api/corpus-sources?task=swav", headers=organizer).json()
    assert [s["name"] for s in offered] == ["builtin:shapes"]
    unknown = client.get("/api/corpus-sources?task=nope", headers=organizer)
    assert unknown.status_code == 400 and unknown.json()["field"] == "task"

    text_for_images = put(client, organizer, source="builtin:python-docstrings")
    assert text_for_images.status_code == 400 and text_for_images.json() == {
        "detail": "no image set 'builtin:python-docstrings' on this server; it offers: builtin:shapes",
        "field": "source",
    }
    response = put(client, organizer, source="builtin:shapes")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["images"], body["eval_images"], body["classes"], body["shards"]) == (4096, 512, 8, 8)
    wrong_size = put(client, organizer, source="builtin:shapes", image_size="64")
    assert wrong_size.status_code == 400 and wrong_size.json()["field"] == "image_size"
    # The task's baseline on it, kept with the corpus as for text.
    row = row_of(db, "swav-run")
    assert row is not None and row.baseline_top1 is not None and 0 < row.baseline_top1 < 1
    # Volunteers take the shards in turn: every shard once before any twice.
    assert (
        client.post("/api/experiments/swav-run/status", headers=organizer, json={"action": "start"}).status_code == 200
    )
    turns = [
        client.post("/api/experiments/swav-run/data/next-shard", headers=organizer).json()["index"] for _ in range(16)
    ]
    assert sorted(turns[:8]) == list(range(8)) and sorted(turns[8:]) == list(range(8))


@pytest.mark.parametrize(("case", "archive", "fragment"), BAD_ARCHIVES, ids=[case[0] for case in BAD_ARCHIVES])
@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's, as it opens the header
def test_a_bad_archive_is_refused_with_what_to_do_and_the_corpus_is_unchanged(
    client, db, settings, organizer, case, archive, fragment
):
    assert put(client, organizer, zip_of(solid_images(64))).status_code == 200  # no labels: no baseline to measure
    before = client.get("/api/experiments/swav-run/corpus", headers=organizer).json()
    on_disk = corpora_on_disk(settings)

    refused = put(client, organizer, archive(), name=f"{case}.zip")

    assert refused.status_code == 400, refused.text
    assert refused.json()["field"] == "file" and fragment in refused.json()["detail"], refused.json()
    assert client.get("/api/experiments/swav-run/corpus", headers=organizer).json() == before
    assert corpora_on_disk(settings) == on_disk  # no half-built folder beside it
    assert row_of(db, "swav-run").text_sha256 == json.loads((on_disk[0] / "manifest.json").read_text())["sha256"]


def test_text_tasks_refuse_archives_and_image_tasks_refuse_text(client, db, settings, organizer, docstrings):
    make_experiment(db, make_user(db, "carol"), slug="albert-run", task="albert-mlm", task_params={"size": "tiny"})
    for data, kind in ((labelled_zip(), "a zip archive"), (tar_of(solid_images(64)), "a gzip archive")):
        refused = put(client, organizer, data, slug="albert-run", **SMALL)
        assert refused.status_code == 400 and refused.json()["field"] == "file", refused.text
        assert f"looks like {kind}" in refused.json()["detail"] and "upload plain text" in refused.json()["detail"]
    refused = put(client, organizer, docstrings, name="docs.txt")
    assert refused.status_code == 400 and refused.json() == {
        "detail": "The file is not a zip or tar archive (its first bytes say neither): upload the images in a .zip, "
        ".tar or .tar.gz archive.",
        "field": "file",
    }
    nothing = put(client, organizer)
    assert nothing.status_code == 400 and nothing.json()["field"] == "file"
    assert corpora_on_disk(settings) == []


def test_an_archive_over_the_image_limit_is_refused(client, organizer, settings):
    settings.corpus_images_max_mb = 0.05  # 51.2 KiB; text keeps its own limit
    over = zip_of(solid_images(400))  # over the limit, within the allowance for the form's framing
    assert 60_000 < len(over) < 100_000
    refused = put(client, organizer, over)
    assert refused.status_code == 400 and refused.json()["field"] == "file"
    assert "larger than the limit of 51.2 KiB (SWARMHUB_CORPUS_IMAGES_MAX_MB)" in refused.json()["detail"]
    far_over = zip_of(solid_images(1000))  # refused by the body limit before the form is read
    assert len(far_over) > 120_000
    refused = put(client, organizer, far_over)
    assert refused.status_code == 413 and refused.json()["field"] == "file"
    assert "this server takes image archives up to 51.2 KiB (SWARMHUB_CORPUS_IMAGES_MAX_MB)" in refused.json()["detail"]
    assert corpora_on_disk(settings) == []
    settings.corpus_images_max_mb = 1
    assert put(client, organizer, far_over).status_code == 200


def test_the_quota_counts_an_image_corpus_before_anything_is_written(client, db, settings):
    settings.quota_corpus_mb = 1  # the shapes' arrays take about 17.6 MiB
    vera = make_user(db, "vera", is_admin=False)
    make_experiment(db, vera, slug="swav-run", task="swav", task_params={})
    refused = put(client, api_token(client, "vera"), source="builtin:shapes")
    assert refused.status_code == 403, refused.text
    assert refused.json()["detail"].startswith("these images take 1")
    assert "(quota: training text): give fewer or smaller images" in refused.json()["detail"]
    assert corpora_on_disk(settings) == [] and row_of(db, "swav-run") is None


def test_the_organizers_page_takes_an_archive_and_shows_errors_inline(client, db, settings, organizer):
    csrf = login(client)
    page = client.get("/experiments/swav-run")
    assert 'name="image_size"' in page.text and "builtin:shapes" in page.text
    assert "builtin:python-docstrings" not in page.text and 'name="vocab_size"' not in page.text
    bad = client.post(
        "/experiments/swav-run/corpus",
        data={"csrf_token": csrf},
        files={"file": ("broken.zip", zip_of({"images/x.png": b"not an image"}), "application/zip")},
    )
    assert bad.status_code == 400
    assert "training needs at least 64" in inline_errors(bad.text)["file"]
    done = client.post(
        "/experiments/swav-run/corpus",
        data={"csrf_token": csrf_from(bad.text), "image_size": "16"},
        files={"file": ("lab.tar.gz", tar_of(solid_images(70)), "application/gzip")},
        follow_redirects=False,
    )
    assert done.status_code == 303, done.text
    shown = client.get("/experiments/swav-run").text
    assert "70 images of 16 x 16 pixels in 1 shards" in shown and "none: no accuracy is measured" in shown
    (folder,) = corpora_on_disk(settings)
    assert load_images(folder / "shard-00000.npy").shape == (70, 3, 16, 16)
