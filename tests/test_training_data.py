"""An experiment's training text through the real routes: the organizer gives it (upload or a text the server
offers), bad uploads are refused with nothing left behind, volunteers download what the manifest lists and take
shards in turn, and checkpoints are listed, pruned and downloadable."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from swarmhub.server.corpus import training_data
from swarmhub.server.live.snapshots import dashboard_snapshot
from swarmhub.server.models import Corpus, Experiment
from swarmhub.worker.tasks import available_tasks, get_task
from swarmhub.worker.tasks.albert import AlbertMLMTask
from swarmhub.worker.tasks.data import LocalCorpus
from swarmhub.worker.tasks.unigram import token_counts, unigram_baseline

from .conftest import DOCSTRING_BYTES, api_token, csrf_from, login, make_experiment, make_user
from .support import SMALL, corpora_on_disk

TEXT_BYTES = DOCSTRING_BYTES  # what the docstrings fixture holds


def albert(db, owner, slug="albert-run", status="draft"):
    return make_experiment(db, owner, slug=slug, status=status, task="albert-mlm", task_params={"size": "tiny"})


def stored(db, slug: str) -> Corpus | None:
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == slug))
        return session.get(Corpus, experiment.id)


def put_text(client: TestClient, headers, data: bytes, name: str = "text.txt", slug="albert-run", **form):
    return client.put(
        f"/api/experiments/{slug}/corpus",
        headers=headers,
        files={"file": (name, data, "text/plain")},
        data={**SMALL, **form},
    )


def test_an_uploaded_text_is_prepared_and_the_experiment_can_start(client, db, settings, docstrings):
    alice = make_user(db)
    albert(db, alice)
    headers = api_token(client)
    # Without its text the experiment cannot start: the error names what is missing.
    refused = client.post("/api/experiments/albert-run/status", headers=headers, json={"action": "start"})
    assert refused.status_code == 409 and refused.json()["field"] == "corpus"

    response = put_text(client, headers, docstrings, name="docs.txt")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["source"] == "upload:docs.txt"
    assert body["bytes"] == len(docstrings.decode().encode())
    assert body["seq_length"] == 32 and 100 < body["vocab_size"] <= 400
    assert body["shards"] >= 1 and body["train_sequences"] > body["eval_sequences"] >= 1
    assert client.get("/api/experiments/albert-run/corpus", headers=headers).json() == body
    assert len(corpora_on_disk(settings)) == 1

    started = client.post("/api/experiments/albert-run/status", headers=headers, json={"action": "start"})
    assert started.status_code == 200 and started.json()["status"] == "running"
    # Running workers stream these shards: the text cannot change under them.
    busy = put_text(client, headers, docstrings)
    assert busy.status_code == 409 and busy.json()["field"] == "source"


@pytest.mark.parametrize("masking", ["whole-word", "token"])
def test_preparing_the_text_stores_the_unigram_baseline_of_the_held_out_masks(
    client, db, settings, docstrings, masking
):
    alice = make_user(db)
    make_experiment(db, alice, slug="albert-run", task="albert-mlm", task_params={"size": "tiny", "masking": masking})
    headers = api_token(client)
    metrics = client.get("/api/experiments/albert-run/metrics", headers=headers)
    assert metrics.json()["baseline"] is None  # no text, no baseline
    assert put_text(client, headers, docstrings).status_code == 200

    # The same numbers from the prepared folder by hand: counts over every shard, the model's own held-out masks.
    row = stored(db, "albert-run")
    folder = training_data.corpus_folder(settings, row)
    local = LocalCorpus(folder)
    task = AlbertMLMTask({"size": "tiny", "masking": masking})
    task.attach(local)
    counts = token_counts([folder / s["name"] for s in local.manifest["shards"]], local.manifest["vocab_size"])
    _, _, labels = task._eval_batches()  # the positions evaluate() scores
    expected = unigram_baseline(counts, labels.numpy(), local.manifest["special_tokens"].values())
    assert (row.baseline_loss, row.baseline_top1, row.baseline_top5) == (
        expected.cross_entropy,
        expected.top1,
        expected.top5,
    )
    assert 0 < expected.top1 < expected.top5 < 1 and expected.cross_entropy > 1

    baseline = client.get("/api/experiments/albert-run/metrics", headers=headers).json()["baseline"]
    assert baseline == {
        "label": "knows only token frequencies",
        "measured_on": "held-out",
        "loss": expected.cross_entropy,
        "top1": expected.top1,
        "top5": expected.top5,
    }


@pytest.mark.parametrize("task_name", sorted(available_tasks()))
def test_every_task_has_a_baseline_on_its_dashboard(client, db, settings, docstrings, task_name):
    alice = make_user(db)
    make_experiment(db, alice, slug="run", status="paused", task=task_name, task_params={})
    if get_task(task_name).needs_corpus:
        headers = api_token(client)
        if get_task(task_name).corpus_kind == "images":
            given = client.put("/api/experiments/run/corpus", headers=headers, data={"source": "builtin:shapes"})
        else:
            given = put_text(client, headers, docstrings, slug="run")
        assert given.status_code == 200, given.text
    baseline = client.get("/api/experiments/run/metrics").json()["baseline"]
    assert baseline["label"] == get_task(task_name).baseline_label != ""
    assert baseline["measured_on"] == ("held-out" if get_task(task_name).keeps_checkpoints else "training")
    assert baseline["loss"] > 0 and 0 < baseline["top1"] < 1
    # The live snapshot carries the same, for the chart's reference line.
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "run"))
        assert dashboard_snapshot(session, experiment, client.app)["metrics"]["baseline"] == baseline


def test_the_digits_baseline_is_its_class_prior():
    baseline = get_task("digits")().baseline()
    # scikit-learn's digits: 1,797 samples, the most frequent digit (3) 183 times, every digit about a tenth
    assert baseline.labels == 1797
    assert baseline.top1 == pytest.approx(183 / 1797)
    assert baseline.cross_entropy == pytest.approx(2.3025, abs=1e-3)  # nearly ln 10: the digits are balanced


@pytest.mark.parametrize(
    ("data", "status", "message"),
    [
        (b"", 400, "empty"),
        (b" \n\t\n", 400, "empty"),
        (b"PK\x03\x04" + bytes(200), 400, "zip"),
        (b"some text\x00\x01\x02 and binary" * 20, 400, "binary"),
        ("caf\u00e9 cr\u00e8me ".encode("latin-1") * 50, 400, "UTF-8"),
    ],
    ids=["empty", "whitespace", "zip", "binary", "latin-1"],
)
def test_bad_uploads_are_refused_and_leave_nothing(client, db, settings, data, status, message):
    alice = make_user(db)
    albert(db, alice)
    headers = api_token(client)
    response = put_text(client, headers, data)
    assert response.status_code == status, response.text
    assert response.json()["field"] == "file"
    assert message.lower() in response.json()["detail"].lower()
    assert stored(db, "albert-run") is None
    assert corpora_on_disk(settings) == []


def test_an_upload_over_the_limit_is_refused_before_it_is_read(client, db, settings):
    settings.corpus_max_mb = 0.05  # 51.2 KiB
    alice = make_user(db)
    albert(db, alice)
    response = put_text(client, api_token(client), b"word " * 30_000)  # 150 KB
    assert response.status_code == 413
    assert response.json()["field"] == "file" and "up to 51.2 KiB" in response.json()["detail"]
    assert stored(db, "albert-run") is None and corpora_on_disk(settings) == []


def test_a_file_name_the_database_cannot_store_is_cleaned(client, db, docstrings):
    alice = make_user(db)
    albert(db, alice)
    # Written by hand: httpx would percent-encode the name, a raw client need not.
    boundary = "swarmhub-test-boundary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="doc\x00s\x07.txt"\r\n'
            "Content-Type: text/plain\r\n\r\n"
        ).encode()
        + docstrings
        + f"\r\n--{boundary}--\r\n".encode()
    )
    response = client.put(
        "/api/experiments/albert-run/corpus",
        headers={**api_token(client), "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=body,
    )
    assert response.status_code == 200, response.text
    assert response.json()["source"] == "upload:doc?s?.txt"
    refused = client.put(
        "/api/experiments/albert-run/corpus", headers=api_token(client), data={"source": "builtin:x\x00", **SMALL}
    )
    assert refused.status_code == 400 and refused.json()["field"] == "source"


def test_too_little_text_says_how_much_is_needed(client, db, settings):
    alice = make_user(db)
    albert(db, alice)
    response = put_text(client, api_token(client), b"Just one short sentence.")
    assert response.status_code == 400 and response.json()["field"] == "file"
    assert "need" in response.json()["detail"]
    assert stored(db, "albert-run") is None and corpora_on_disk(settings) == []


def test_a_replaced_text_removes_the_old_files_and_a_failed_one_keeps_them(client, db, settings, docstrings):
    alice = make_user(db)
    albert(db, alice)
    headers = api_token(client)
    assert put_text(client, headers, docstrings).status_code == 200
    first = corpora_on_disk(settings)
    assert put_text(client, headers, b"\x00\x01binary" * 10).status_code == 400
    assert corpora_on_disk(settings) == first  # the failed one changed nothing
    assert put_text(client, headers, docstrings[: TEXT_BYTES // 2], vocab_size="300").status_code == 200
    second = corpora_on_disk(settings)
    assert len(second) == 1 and second != first
    assert stored(db, "albert-run").vocab_size <= 300


def test_texts_the_server_offers(client, db, settings, tmp_path, docstrings):
    settings.corpus_dir = tmp_path / "texts"
    settings.corpus_dir.mkdir()
    (settings.corpus_dir / "bengali.txt").write_bytes(docstrings)
    (settings.corpus_dir / "notes.md").write_text("not offered: only .txt files are")
    alice = make_user(db)
    albert(db, alice)
    headers = api_token(client)
    offered = client.get("/api/corpus-sources", headers=headers).json()
    assert [s["name"] for s in offered] == ["builtin:python-docstrings", "server:bengali.txt"]
    assert client.get("/api/corpus-sources").status_code == 401

    response = client.put(
        "/api/experiments/albert-run/corpus", headers=headers, data={"source": "server:bengali.txt", **SMALL}
    )
    assert response.status_code == 200, response.text
    assert response.json()["source"] == "server:bengali.txt"
    for bad in ("server:../../etc/passwd", "server:notes.md", "builtin:nope", "/etc/passwd"):
        refused = client.put("/api/experiments/albert-run/corpus", headers=headers, data={"source": bad, **SMALL})
        assert refused.status_code == 400 and refused.json()["field"] == "source", bad
    assert stored(db, "albert-run").source == "server:bengali.txt"


def test_only_the_organizer_gives_text_and_only_to_a_task_that_trains_on_one(client, db, docstrings):
    alice = make_user(db)
    make_user(db, "bob")
    albert(db, alice)
    make_experiment(db, alice, slug="digits-run")
    bob = api_token(client, "bob")
    assert put_text(client, bob, docstrings).status_code == 404  # a draft: bob does not even see it
    alice_headers = api_token(client)
    wrong_task = put_text(client, alice_headers, docstrings, slug="digits-run")
    assert wrong_task.status_code == 400 and "no corpus" in wrong_task.json()["detail"]
    assert put_text(client, {}, docstrings).status_code == 401
    bad_size = put_text(client, alice_headers, docstrings, vocab_size="5")
    assert bad_size.status_code == 422 and "vocab_size" in json.dumps(bad_size.json())


def test_volunteers_download_the_manifest_files_and_take_shards_in_turn(client, db, settings, docstrings):
    alice = make_user(db)
    make_user(db, "bob")
    albert(db, alice)
    headers = api_token(client)
    assert put_text(client, headers, docstrings[:60_000], seq_length="16").status_code == 200
    # A draft serves nothing to volunteers.
    assert client.get("/api/experiments/albert-run/data/manifest", headers=headers).status_code == 409
    client.post("/api/experiments/albert-run/status", headers=headers, json={"action": "start"})
    bob = api_token(client, "bob")
    assert client.get("/api/experiments/albert-run/data/manifest").status_code == 401

    manifest = client.get("/api/experiments/albert-run/data/manifest", headers=bob).json()
    assert manifest["seq_length"] == 16 and manifest["special_tokens"]["mask"] == 4
    names = list(manifest["files"]) + [s["name"] for s in manifest["shards"]]
    digests = {
        **{n: f["sha256"] for n, f in manifest["files"].items()},
        **{s["name"]: s["sha256"] for s in manifest["shards"]},
    }
    for name in names:
        got = client.get(f"/api/experiments/albert-run/data/files/{name}", headers=bob)
        assert got.status_code == 200, name
        assert hashlib.sha256(got.content).hexdigest() == digests[name]
    for bad in ("../../swarmhub.db", "manifest.json/../../x", "shards/99999.npy", "%2e%2e/secret"):
        assert client.get(f"/api/experiments/albert-run/data/files/{bad}", headers=bob).status_code == 404, bad

    # Two volunteers asking in turn: every shard once before any shard twice.
    count = len(manifest["shards"])
    assert count >= 2
    turns = [
        client.post("/api/experiments/albert-run/data/next-shard", headers=h).json()["index"]
        for h in [bob, headers] * count
    ]
    assert sorted(turns[:count]) == list(range(count))
    assert sorted(turns[count:]) == list(range(count))

    # A removed volunteer gets nothing more.
    client.post("/api/experiments/albert-run/bans", headers=headers, json={"username": "bob"})
    assert client.get("/api/experiments/albert-run/data/manifest", headers=bob).status_code == 403
    assert client.post("/api/experiments/albert-run/data/next-shard", headers=bob).status_code == 403


def test_the_organizers_form_prepares_text_and_shows_errors_inline(client, db, settings, docstrings):
    alice = make_user(db)
    albert(db, alice)
    csrf = login(client)
    page = client.get("/experiments/albert-run")
    assert 'id="corpus-form"' in page.text and "builtin:python-docstrings" in page.text
    bad = client.post(
        "/experiments/albert-run/corpus",
        data={"csrf_token": csrf, **SMALL},
        files={"file": ("photo.txt", b"\x89PNG\r\n\x1a\n" + bytes(100), "text/plain")},
    )
    assert bad.status_code == 400 and 'id="error-file"' in bad.text and "PNG" in bad.text
    no_csrf = client.post("/experiments/albert-run/corpus", data=SMALL, files={"file": ("a.txt", docstrings)})
    assert no_csrf.status_code == 403 and stored(db, "albert-run") is None
    ok = client.post(
        "/experiments/albert-run/corpus",
        data={"csrf_token": csrf, **SMALL},
        files={"file": ("docs.txt", docstrings, "text/plain")},
        follow_redirects=False,
    )
    assert ok.status_code == 303, ok.text
    page = client.get("/experiments/albert-run")
    assert 'id="corpus-info"' in page.text and "upload:docs.txt" in page.text
    assert "csrf_token" in page.text and csrf_from(page.text)


def test_checkpoints_are_listed_pruned_and_the_newest_downloads(client, db, settings):
    alice = make_user(db)
    albert(db, alice, status="running")
    assert client.get("/api/experiments/albert-run/model").status_code == 404
    settings.checkpoints_kept = 2
    root = settings.data_dir / "checkpoints"
    with db.begin() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "albert-run"))
        for epoch, loss in ((3, 6.5), (7, 5.25), (12, 4.0)):
            folder = root / "run" / f"{epoch:010d}"
            (folder / "model").mkdir(parents=True)
            with zipfile.ZipFile(folder / "model.zip", "w") as archive:
                archive.writestr("config.json", json.dumps({"step": epoch}))
            training_data.record_checkpoint(
                session, settings, experiment, epoch, loss, f"run/{epoch:010d}", eval_top1=epoch / 100, eval_top5=0.5
            )
    listed = client.get("/api/experiments/albert-run/checkpoints").json()
    assert [(c["epoch"], c["eval_loss"], c["eval_top1"], c["eval_top5"], c["downloadable"]) for c in listed] == [
        (3, 6.5, 0.03, 0.5, False),
        (7, 5.25, 0.07, 0.5, True),
        (12, 4.0, 0.12, 0.5, True),
    ]
    assert not (root / "run" / f"{3:010d}").exists() and (root / "run" / f"{7:010d}").exists()
    download = client.get("/api/experiments/albert-run/model")
    assert download.status_code == 200 and download.headers["content-type"] == "application/zip"
    assert 'filename="albert-run-step12.zip"' in download.headers["content-disposition"]
    with zipfile.ZipFile(io.BytesIO(download.content)) as archive:
        assert json.loads(archive.read("config.json")) == {"step": 12}
    # The dashboard's live snapshot carries them too (its held-out loss chart and download link).
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "albert-run"))
        snapshot = dashboard_snapshot(session, experiment, client.app)
    assert [(c["epoch"], c["eval_top1"]) for c in snapshot["checkpoints"]] == [(3, 0.03), (7, 0.07), (12, 0.12)]


ROLES = {"admin": "root", "anonymous": None, "volunteer": "vera", "other-organizer": "otto", "organizer": "olga"}


def test_who_may_give_an_experiment_its_text(client, db, settings, tmp_path, docstrings):
    """Only the experiment's organizer and administrators, through the API and through the page's form."""
    settings.corpus_dir = tmp_path / "texts"
    settings.corpus_dir.mkdir()
    (settings.corpus_dir / "small.txt").write_bytes(docstrings)
    users = {role: make_user(db, name) for role, name in ROLES.items() if name}  # root first: the administrator
    albert(db, users["organizer"], status="paused")
    make_experiment(db, users["other-organizer"], slug="other-run")
    form = {"source": "server:small.txt", **SMALL}

    def folder() -> str | None:
        row = stored(db, "albert-run")
        return row.folder if row is not None else None

    for role, name in ROLES.items():
        headers = api_token(client, name) if name else {}
        before = folder()
        response = client.put("/api/experiments/albert-run/corpus", headers=headers, data=form)
        expected = {"anonymous": 401, "volunteer": 403, "other-organizer": 403}.get(role, 200)
        assert response.status_code == expected, (role, response.text)
        assert (folder() != before) == (expected == 200), role
    for role, name in ROLES.items():
        page_client = TestClient(client.app)
        csrf = login(page_client, name) if name else csrf_from(page_client.get("/login").text)
        before = folder()
        response = page_client.post(
            "/experiments/albert-run/corpus", data={**form, "csrf_token": csrf}, follow_redirects=False
        )
        expected = {"anonymous": 303, "volunteer": 403, "other-organizer": 403}.get(role, 303)
        assert response.status_code == expected, (role, response.text[:300])
        assert (folder() != before) == (role in ("organizer", "admin")), role
        if role == "anonymous":
            assert response.headers["location"].startswith("/login")


def test_the_demo_seeds_an_albert_experiment_ready_to_train(tmp_path):
    """`swarmhub demo`'s data: the ALBERT experiment runs with the standard library's docstrings prepared, the
    digits one waits as a draft, and the two volunteers' tokens work."""
    from swarmhub.server.app import create_app
    from swarmhub.server.cli import _seed_demo
    from swarmhub.server.core.settings import Settings

    demo = Settings(environment="test", data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'demo.db'}")
    password, tokens = _seed_demo(demo)
    assert len(tokens) == 2 and len(password) >= 12
    with TestClient(create_app(demo.model_copy(update={"swarm_enabled": False}))) as client:
        listed = {e["slug"]: e for e in client.get("/api/experiments").json()}
        assert {slug: e["status"] for slug, e in listed.items()} == {"demo-albert": "running"}  # digits: a draft
        text = client.get("/api/experiments/demo-albert/corpus").json()
        assert text["source"] == "builtin:python-docstrings" and text["shards"] >= 5
        volunteer = {"Authorization": f"Bearer {tokens[0]}"}
        manifest = client.get("/api/experiments/demo-albert/data/manifest", headers=volunteer)
        assert manifest.status_code == 200 and manifest.json()["vocab_size"] == text["vocab_size"]
        albert = client.get("/api/experiments/demo-albert").json()
        # both demo peers (one thread each: peaks of 200-240 samples/s on 2 cores, docs/benchmarks/demo-albert.md)
        # train unthrottled: the page warns of nothing
        assert albert["max_swarm_samples_per_second"] >= 2 * 250 and albert["warnings"] == [], albert


def test_the_digits_demo_starts_only_the_digits_experiment_and_trains_no_tokenizer(tmp_path):
    """`swarmhub demo --experiment demo-digits`: the digits experiment runs; the ALBERT one waits as a draft with no
    text prepared, so no tokenizer is trained and no swarm of it takes the workers' cores."""
    from swarmhub.server.app import create_app
    from swarmhub.server.cli import _seed_demo
    from swarmhub.server.core.settings import Settings

    demo = Settings(environment="test", data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'demo.db'}")
    password, _ = _seed_demo(demo, "demo-digits")
    with TestClient(create_app(demo.model_copy(update={"swarm_enabled": False}))) as client:
        listed = {e["slug"]: e for e in client.get("/api/experiments").json()}
        assert {slug: e["status"] for slug, e in listed.items()} == {"demo-digits": "running"}
        organizer = api_token(client, "organizer", password)
        albert = client.get("/api/experiments/demo-albert", headers=organizer)
        assert albert.status_code == 200 and albert.json()["status"] == "draft", albert.text
        assert client.get("/api/experiments/demo-albert/corpus", headers=organizer).status_code == 404
