"""The hub's front page, ``GET /api/hub`` and the open statistics export, against what the ledger and the metrics
hold: reports through the real report websocket, verified samples through the ledger's own services (as the
monitor peer's reads feed it), pages and JSON through the real routes."""

from __future__ import annotations

import csv
import gzip
import html
import io
import re
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from swarmhub.server import metrics
from swarmhub.server.app import create_app
from swarmhub.server.community.exports import accepts_gzip
from swarmhub.server.ledger import contributions, witnessed
from swarmhub.server.models import Checkpoint, Experiment, WorkerRun, utcnow
from swarmhub.server.services import services

from .conftest import api_token, make_experiment, make_user
from .support import report, worker_run

ALBERT = {"task": "albert-mlm", "task_params": {"size": "tiny", "warmup_steps": 10, "total_steps": 1000}}
HOSTILE = "ALBERT <b>together</b>"


def send_reports(client: TestClient, headers: dict[str, str], slug: str, worker_id: str, count: int) -> None:
    """``count`` reports of 100 samples/s each (``support.report``), acknowledged one by one."""
    with client.websocket_connect(f"/ws/experiments/{slug}/report?worker_id={worker_id}", headers=headers) as ws:
        for seq in range(count):
            ws.send_text(report(seq, samples=32 * (seq + 1)))
            assert ws.receive_json() == {"type": "ack", "seq": seq}


def verify(db: Any, slug: str, username: str, peer: str, weight: float) -> None:
    """One read of a peer's signed progress record, then one witnessed round crediting it ``weight`` samples."""
    now = utcnow()
    record = {"peer_id": peer, "username": username, "epoch": 1, "samples": 64, "samples_per_second": 50.0}
    round_ = {"id": f"round-{slug}", "epoch": 1, "time": now.timestamp()}
    with db.begin() as session:
        experiment = session.query(Experiment).filter_by(slug=slug).one()
        contributions.record(session, experiment, contributions.parse([{**record, "time": now.timestamp()}]), now)
    with db.begin() as session:
        experiment = session.query(Experiment).filter_by(slug=slug).one()
        sender = {"peer_id": peer, "username": username, "weight": weight}
        assert witnessed.record_rounds(
            session, experiment, witnessed.parse_rounds([{**round_, "senders": [sender]}]), now
        )


@pytest.fixture
def hub_world(client, db):
    """Two running experiments with reports and verified samples (ada works on both), a finished one, a draft."""
    olga = make_user(db, "olga")
    ada, bob = make_user(db, "ada"), make_user(db, "bob")
    make_experiment(db, olga, slug="albert-run", status="running", title=HOSTILE, **ALBERT)
    make_experiment(db, olga, slug="digits-run", status="running")
    make_experiment(db, olga, slug="done", status="finished")
    make_experiment(db, olga, slug="secret", status="draft")
    ada_headers, bob_headers = api_token(client, "ada"), api_token(client, "bob")
    send_reports(client, ada_headers, "albert-run", worker_run(db, ada, "albert-run"), 6)  # epochs 0 and 1
    send_reports(client, bob_headers, "albert-run", worker_run(db, bob, "albert-run"), 2)
    send_reports(client, ada_headers, "digits-run", worker_run(db, ada, "digits-run"), 3)
    verify(db, "albert-run", "ada", "peer-ada-1", 96)
    verify(db, "digits-run", "ada", "peer-ada-2", 50)


def summary_of(db: Any, app: Any, slug: str) -> metrics.Summary:
    with db() as session:
        experiment = session.query(Experiment).filter_by(slug=slug).one()
        return metrics.summary(session, experiment, services(app).settings.active_window_seconds)


def row_of(page: str, slug: str) -> dict[str, str]:
    """The front page's figures for one experiment, as text."""
    match = re.search(rf'<tr data-slug="{slug}">(.*?)</tr>', page, re.S)
    assert match, slug
    cells = dict(re.findall(r'class="(fig-[a-z]+)[^"]*">([^<]*)<', match.group(1)))
    return {key: html.unescape(value).strip() for key, value in cells.items()} | {"row": match.group(1)}


def test_front_page_and_api_show_what_the_ledger_holds(client, db, app, hub_world):
    hub = client.get("/api/hub").json()
    rows = {e["slug"]: e for e in hub["experiments"]}
    assert list(rows) == ["done", "digits-run", "albert-run"]  # newest first; the draft is not public
    for slug in ("albert-run", "digits-run"):
        summary = summary_of(db, app, slug)
        assert rows[slug]["samples_per_second"] == summary.samples_per_second
        assert rows[slug]["verified_samples"] == summary.verified_samples
        assert rows[slug]["step"] == summary.epoch
    albert, digits = rows["albert-run"], rows["digits-run"]
    assert (albert["volunteers_online"], albert["samples_per_second"], albert["verified_samples"]) == (2, 200.0, 96)
    assert (digits["volunteers_online"], digits["samples_per_second"], digits["verified_samples"]) == (1, 100.0, 50)
    assert (albert["volunteers"], digits["volunteers"]) == (2, 1)
    assert (albert["step"], albert["total_steps"], albert["progress"]) == (1, 1000, 0.001)
    # 999 steps of target_batch_size (128) samples, at 200 samples/s
    assert albert["eta_seconds"] == pytest.approx(999 * 128 / 200, abs=0.1)
    assert (digits["total_steps"], digits["progress"], digits["eta_seconds"]) == (None, None, None)
    assert hub["totals"] == {
        "experiments": 3,
        "running_experiments": 2,
        "volunteers_online": 2,  # ada works on both: counted once
        "volunteers": 2,
        "samples_per_second": 300.0,
        "verified_samples": 146,
        "claimed_samples": summary_of(db, app, "albert-run").total_samples
        + summary_of(db, app, "digits-run").total_samples,
        "finished_experiments": 1,
        "models_trained": 1,
    }

    page = client.get("/").text
    albert_row, digits_row = row_of(page, "albert-run"), row_of(page, "digits-run")
    assert {k: albert_row[k] for k in ("fig-online", "fig-sps", "fig-verified", "fig-steps", "fig-eta")} == {
        "fig-online": "2",
        "fig-sps": "200.0",
        "fig-verified": "96",
        "fig-steps": "step 1 of 1,000",
        "fig-eta": "about 10 min to go",
    }
    assert (digits_row["fig-online"], digits_row["fig-sps"], digits_row["fig-verified"]) == ("1", "100.0", "50")
    assert digits_row["fig-steps"] == "" and digits_row["fig-eta"] == ""
    assert re.search(r'id="hub-online">2<', page) and re.search(r'id="hub-verified">146<', page)
    assert html.escape(HOSTILE) in page and HOSTILE not in page  # the title is text, not markup
    assert "secret" not in page  # an anonymous visitor sees no draft


def test_no_eta_without_a_rate_or_while_paused(client, db):
    olga, ada = make_user(db, "olga"), make_user(db, "ada")
    make_experiment(db, olga, slug="idle", status="running", **ALBERT)  # a total, no one reporting
    make_experiment(db, olga, slug="resting", status="running", **ALBERT)
    send_reports(client, api_token(client, "ada"), "resting", worker_run(db, ada, "resting"), 2)
    with db.begin() as session:
        session.query(Experiment).filter_by(slug="resting").one().status = "paused"
    rows = {e["slug"]: e for e in client.get("/api/hub").json()["experiments"]}
    assert (rows["idle"]["samples_per_second"], rows["idle"]["progress"], rows["idle"]["eta_seconds"]) == (
        0.0,
        0.0,
        None,
    )
    assert rows["resting"]["samples_per_second"] == 100.0  # its worker reported within the window
    assert rows["resting"]["eta_seconds"] is None  # paused: the rate says nothing about when it ends
    page = client.get("/").text
    assert row_of(page, "idle")["fig-eta"] == "" and row_of(page, "resting")["fig-eta"] == ""
    assert "to go" not in page


def test_a_checkpoint_counts_as_a_model_trained(client, db):
    olga = make_user(db, "olga")
    experiment = make_experiment(db, olga, slug="keeper", status="paused", **ALBERT)
    assert client.get("/api/hub").json()["totals"]["models_trained"] == 0
    with db.begin() as session:
        session.add(Checkpoint(experiment_id=experiment.id, epoch=5, eval_loss=3.2, folder="keeper/5"))
    with TestClient(create_app(services(client.app).settings)) as fresh:  # another process: nothing cached
        assert fresh.get("/api/hub").json()["totals"]["models_trained"] == 1


def test_export_csv_parses_and_matches_the_json(client, db, hub_world):
    as_json = client.get("/api/stats/experiments.json")
    as_csv = client.get("/api/stats/experiments.csv")
    assert as_json.status_code == as_csv.status_code == 200
    assert as_csv.headers["content-type"] == "text/csv; charset=utf-8"
    rows = as_json.json()
    assert [r["slug"] for r in rows] == ["done", "digits-run", "albert-run"]
    assert {r["slug"]: (r["volunteers"], r["verified_samples"]) for r in rows} == {
        "done": (0, 0),
        "digits-run": (1, 50),
        "albert-run": (2, 96),
    }
    parsed = list(csv.DictReader(io.StringIO(as_csv.text)))
    assert [{k: str(v) for k, v in r.items()} for r in rows] == parsed
    assert list(parsed[0]) == ["slug", "title", "status", "volunteers", "verified_samples", "created_at"]
    hub = {e["slug"]: e for e in client.get("/api/hub").json()["experiments"]}
    assert all(r["created_at"] == hub[r["slug"]]["created_at"] and r["title"] == hub[r["slug"]]["title"] for r in rows)
    for response in (as_json, as_csv):
        assert response.headers["cache-control"] == "public, max-age=300"
        assert response.headers["vary"] == "Accept-Encoding"
        assert re.fullmatch(r'"[0-9a-f]{32}(-gzip)?"', response.headers["etag"])


def test_export_is_gzipped_when_asked_and_answers_304_to_its_etag(client, db, hub_world):
    for path in ("/api/stats/experiments.json", "/api/stats/experiments.csv"):
        plain = client.get(path, headers={"Accept-Encoding": "identity"})
        assert "content-encoding" not in plain.headers
        zipped = client.get(path, headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        assert zipped.content == plain.content  # httpx undid the gzip
        refused = client.get(path, headers={"Accept-Encoding": "gzip;q=0, identity"})
        assert "content-encoding" not in refused.headers
        assert zipped.headers["etag"] != plain.headers["etag"]
        again = client.get(path, headers={"Accept-Encoding": "identity", "If-None-Match": plain.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == plain.headers["etag"]
        other = client.get(path, headers={"Accept-Encoding": "gzip", "If-None-Match": plain.headers["etag"]})
        assert other.status_code == 200  # the gzipped body is another representation, with its own tag
        with client.stream("GET", path, headers={"Accept-Encoding": "gzip"}) as stream:
            raw = b"".join(stream.iter_raw())  # the bytes as sent
        assert raw[:2] == b"\x1f\x8b" and gzip.decompress(raw) == plain.content


@pytest.mark.parametrize(
    ("header", "gzipped"),
    [("gzip", True), ("br, gzip;q=0.5", True), ("*", True), ("gzip;q=0", False), ("identity", False), ("", False)],
)
def test_accept_encoding_is_read_as_rfc_9110_says(header, gzipped):
    assert accepts_gzip(header) is gzipped


def test_export_is_rebuilt_at_most_every_interval(client, db, settings):
    olga = make_user(db, "olga")
    make_experiment(db, olga, slug="first", status="running")
    before = client.get("/api/stats/experiments.json")
    make_experiment(db, olga, slug="second", status="running")
    after = client.get("/api/stats/experiments.json")
    assert [r["slug"] for r in after.json()] == ["first"]  # within SWARMHUB_STATS_CACHE_SECONDS (300)
    assert after.headers["etag"] == before.headers["etag"]
    every_time = settings.model_copy(update={"stats_cache_seconds": 0})
    with TestClient(create_app(every_time)) as fresh:
        assert [r["slug"] for r in fresh.get("/api/stats/experiments.json").json()] == ["second", "first"]
        make_experiment(db, olga, slug="third", status="finished")
        assert len(fresh.get("/api/stats/experiments.csv").text.splitlines()) == 4


def test_a_title_a_spreadsheet_would_run_is_defused_in_the_csv_only(client, db):
    olga = make_user(db, "olga")
    make_experiment(db, olga, slug="formula", status="running", title='=HYPERLINK("http://x")')
    assert client.get("/api/stats/experiments.json").json()[0]["title"] == '=HYPERLINK("http://x")'
    assert list(csv.DictReader(io.StringIO(client.get("/api/stats/experiments.csv").text)))[0]["title"] == (
        '\'=HYPERLINK("http://x")'
    )


def test_active_window_bounds_who_is_online(client, db, app):
    """A volunteer whose worker last reported before the window is no longer online, and their rate is gone."""
    olga, ada = make_user(db, "olga"), make_user(db, "ada")
    make_experiment(db, olga, slug="quiet", status="running", **ALBERT)
    send_reports(client, api_token(client, "ada"), "quiet", worker_run(db, ada, "quiet"), 1)
    window = services(app).settings.active_window_seconds
    with db.begin() as session:
        experiment = session.query(Experiment).filter_by(slug="quiet").one()
        for run in session.query(WorkerRun).filter_by(experiment_id=experiment.id):
            run.last_seen_at = utcnow() - timedelta(seconds=window + 1)
    with TestClient(create_app(services(app).settings)) as fresh:
        row = fresh.get("/api/hub").json()["experiments"][0]
    assert (row["volunteers_online"], row["samples_per_second"], row["volunteers"], row["eta_seconds"]) == (
        0,
        0.0,
        1,
        None,
    )


def test_a_stale_copy_is_served_while_one_caller_rebuilds_it():
    """The hub's and the exports' cache: past its age, one caller rebuilds while the others get the previous copy
    at once (requests each hold a server thread: they must not queue behind a slow rebuild)."""
    import threading
    import time

    from swarmhub.server.community.exports import Kept

    kept = Kept(max_age=0.05)
    assert kept.get(lambda: "first") == "first"  # the first build is waited for
    time.sleep(0.06)
    started, release = threading.Event(), threading.Event()

    def slow_build() -> str:
        started.set()
        release.wait(5)
        return "second"

    rebuilt: list[str] = []
    rebuilder = threading.Thread(target=lambda: rebuilt.append(kept.get(slow_build)))
    rebuilder.start()
    assert started.wait(5)
    t = time.monotonic()
    assert kept.get(lambda: "never built") == "first"  # served the previous copy, not a second build
    assert time.monotonic() - t < 0.5
    release.set()
    rebuilder.join(5)
    assert rebuilt == ["second"] and kept.get(lambda: "never built") == "second"


def test_the_front_page_poll_is_encoded_once_and_revalidated_by_etag(client, db):
    """``/api/hub`` is polled by every open front page: the same body for a couple of seconds, with an ETag that a
    poll sends back to get a 304 instead of the body, gzipped for a client that accepts it."""
    first = client.get("/api/hub", headers={"Accept-Encoding": "identity"})
    assert first.status_code == 200 and first.headers["cache-control"] == "no-cache"
    assert "content-encoding" not in first.headers
    etag = first.headers["etag"]
    again = client.get("/api/hub", headers={"If-None-Match": etag, "Accept-Encoding": "identity"})
    assert again.status_code == 304 and again.content == b""
    zipped = client.get("/api/hub", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip" and zipped.json() == first.json()
    assert zipped.headers["etag"] != etag  # each representation has its own tag
