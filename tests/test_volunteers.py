"""Volunteers' public side: the profile page and its JSON show what the ledger holds; a volunteer hides their
profile from the account page (CSRF-checked), after which page, JSON and the open statistics export answer as if
the name did not exist while leaderboards still count the work; the export's CSV and JSON agree, gzip is served
when asked, with an ETag, and a copy is kept per process for ``stats_cache_seconds``."""

from __future__ import annotations

import csv
import gzip
import html
import io
import json
import re
import urllib.request
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from swarmhub.server import experiments
from swarmhub.server.app import create_app
from swarmhub.server.ledger import contributions
from swarmhub.server.models import RoundCredit, User, utcnow

from .conftest import LiveServer, api_token, csrf_from, login, make_experiment, make_user
from .support import observe, report_over_websocket, witness

pytestmark = pytest.mark.both_databases  # the history groups by time with each database's own functions

PAYLOAD = "<img src=x onerror=alert(1)>"


@pytest.fixture
def ledger(client, db):
    """ada helped two experiments (and a draft no one else sees), grace one of them; olga organizes."""
    olga, ada, grace = make_user(db, "olga"), make_user(db, "ada"), make_user(db, "grace")
    alpha = make_experiment(db, olga, slug="alpha", status="running", title=PAYLOAD)
    beta = make_experiment(db, olga, slug="beta", status="running")
    draft = make_experiment(db, olga, slug="hidden-draft", status="running")
    report_over_websocket(client, db, ada, "alpha", "cuda:0", 150)
    report_over_websocket(client, db, grace, "alpha", "cpu", 40)
    report_over_websocket(client, db, ada, "beta", "cpu", 60)
    t0 = utcnow()
    observe(db, alpha.id, t0, ("ada", "QmA", 1, 100), ("grace", "QmG", 1, 28))
    observe(db, alpha.id, t0 + timedelta(seconds=2), ("ada", "QmA", 1, 120), ("grace", "QmG", 1, 30))
    witness(db, alpha.id, t0 + timedelta(seconds=3), "a-1", 1, [("ada", "QmA", 120.0), ("grace", "QmG", 30.0)])
    observe(db, beta.id, t0 + timedelta(seconds=4), ("ada", "QmB", 1, 50))
    witness(db, beta.id, t0 + timedelta(seconds=5), "b-1", 1, [("ada", "QmB", 50.0)])
    observe(db, draft.id, t0, ("ada", "QmD", 1, 70))
    witness(db, draft.id, t0 + timedelta(seconds=6), "d-1", 1, [("ada", "QmD", 70.0)])
    with db.begin() as session:  # only the organizer sees a draft: its work stays off the public profile
        session.get(experiments.Experiment, draft.id).status = "draft"
    return {"olga": olga, "ada": ada, "grace": grace, "alpha": alpha, "beta": beta}


def test_profile_figures_equal_the_ledgers(client, db, ledger):
    ada = ledger["ada"]
    with db() as session:
        recount = {
            slug: contributions.by_user(session, session.get(experiments.Experiment, ledger[slug].id))
            for slug in ("alpha", "beta")
        }
        credited = dict(
            session.execute(
                select(RoundCredit.experiment_id, func.sum(RoundCredit.credited))
                .where(RoundCredit.user_id == ada.id)
                .group_by(RoundCredit.experiment_id)
            ).all()
        )
    profile = client.get("/api/users/ada").json()
    assert profile["username"] == "ada"
    rows = {e["slug"]: e for e in profile["experiments"]}
    assert set(rows) == {"alpha", "beta"}  # not the draft
    for slug, row in rows.items():
        ledger_row = recount[slug][ada.id]
        everyone = sum(v.samples for v in recount[slug].values())
        assert row["verified_samples"] == ledger_row.samples == credited[ledger[slug].id]
        assert row["share"] == round(ledger_row.samples / everyone, 4)
        assert row["time_online_seconds"] == pytest.approx(ledger_row.online_seconds)
        assert row["url"] == f"/experiments/{slug}"
    # The round in alpha credits ada as much as grace's peer (the window bound); beta's round is hers alone.
    assert (rows["alpha"]["verified_samples"], rows["alpha"]["share"]) == (30, 0.5)
    assert (rows["beta"]["verified_samples"], rows["beta"]["share"]) == (50, 1.0)
    assert rows["alpha"]["time_online_seconds"] == pytest.approx(2.0)
    assert (rows["alpha"]["device_classes"], rows["beta"]["device_classes"]) == (["cuda"], ["cpu"])
    assert [e["slug"] for e in profile["experiments"]] == ["beta", "alpha"]  # most verified first
    assert profile["verified_samples"] == 80
    assert profile["device_classes"] == ["cpu", "cuda"]
    history = profile["history"]
    assert history and history[-1]["verified_samples"] == 80
    assert all(p["t"] % profile["history_bucket_seconds"] == 0 for p in history)
    assert [p["verified_samples"] for p in history] == sorted(p["verified_samples"] for p in history)

    page = client.get("/u/ada")
    assert page.status_code == 200
    cells = dict(re.findall(r'<tr data-slug="([^"]+)">.*?<td class="verified">([\d,]+)', page.text, re.S))
    assert cells == {"alpha": "30", "beta": "50"}
    assert 'href="/experiments/alpha"' in page.text and 'href="/experiments/hidden-draft"' not in page.text
    assert html.escape(PAYLOAD) in page.text and PAYLOAD not in page.text  # the title is text, not markup

    board = client.get("/api/experiments/alpha/leaderboard").json()
    assert [(e["username"], e["profile_url"]) for e in board] == [("ada", "/u/ada"), ("grace", "/u/grace")]


def test_unknown_and_hidden_profiles_answer_alike_and_the_account_form_toggles_hiding(app, client, db, ledger):
    def answers(name: str) -> tuple[Any, ...]:
        api, page = client.get(f"/api/users/{name}"), client.get(f"/u/{name}")
        return api.status_code, api.json()["detail"].replace(name, "NAME"), page.status_code

    assert answers("nobody") == (404, "no volunteer 'NAME'", 404)
    csrf = login(client, "ada")
    assert client.get("/u/ada").status_code == 200

    # Without this session's CSRF token the form is refused and the profile stays visible.
    for extra in ({}, {"csrf_token": "forged"}):
        refused = client.post("/account/profile", data={"profile_hidden": "on", **extra}, follow_redirects=False)
        assert refused.status_code == 403
    assert client.get("/api/users/ada").status_code == 200

    hidden = client.post("/account/profile", data={"profile_hidden": "on", "csrf_token": csrf}, follow_redirects=False)
    assert hidden.status_code == 303 and hidden.headers["location"] == "/account#profile"
    assert 'name="profile_hidden" checked' in client.get("/account").text
    assert answers("ada") == answers("nobody")  # hiding does not tell anyone the name exists
    assert "ada" not in [row["username"] for row in client.get("/api/stats/volunteers.json").json()["volunteers"]]
    board = client.get("/api/experiments/alpha/leaderboard").json()  # the ledger is the ledger
    assert [(e["username"], e["samples"], e["profile_url"]) for e in board] == [
        ("ada", 30, None),
        ("grace", 30, "/u/grace"),
    ]

    shown = client.post("/account/profile", data={"csrf_token": csrf}, follow_redirects=False)  # box unticked
    assert shown.status_code == 303
    assert client.get("/api/users/ada").status_code == 200
    with db() as session:
        assert session.scalar(select(User.profile_hidden).where(User.username == "ada")) is False


def test_export_lists_visible_volunteers_and_its_csv_matches_its_json(client, db, ledger):
    response = client.get("/api/stats/volunteers.json")
    assert response.status_code == 200
    assert response.headers["cache-control"] == "public, max-age=300"
    rows = response.json()["volunteers"]
    # ada: 30 + 50 in two public experiments (the draft's 70 is not shown); grace: 30 in one; olga helped none
    assert rows == [
        {"username": "ada", "verified_samples": 80, "experiments": 2},
        {"username": "grace", "verified_samples": 30, "experiments": 1},
    ]
    text = client.get("/api/stats/volunteers.csv")
    assert text.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(text.text)))
    assert [{k: (v if k == "username" else int(v)) for k, v in row.items()} for row in parsed] == rows


def test_export_is_gzipped_when_asked_with_an_etag_and_kept_per_process(app, db, ledger):
    with LiveServer(app) as server:

        def fetch(path: str, **headers: str) -> tuple[int, Any, bytes]:
            request = urllib.request.Request(server.url + path, headers=headers)
            try:
                with urllib.request.urlopen(request) as response:  # urllib does not decode: the bytes as sent
                    return response.status, response.headers, response.read()  # names in any case
            except urllib.error.HTTPError as error:
                return error.code, error.headers, error.read()

        for path in ("/api/stats/volunteers.json", "/api/stats/volunteers.csv"):
            status, plain_headers, plain = fetch(path)
            assert status == 200 and "Content-Encoding" not in plain_headers
            status, headers, packed = fetch(path, **{"Accept-Encoding": "br, gzip;q=0.8"})
            assert status == 200 and headers["Content-Encoding"] == "gzip" and headers["Vary"] == "Accept-Encoding"
            assert packed[:2] == b"\x1f\x8b" and gzip.decompress(packed) == plain
            assert headers["Cache-Control"] == "public, max-age=300"
            assert headers["ETag"] != plain_headers["ETag"]  # one validator per coding of the same content
            status, refused_headers, _ = fetch(path, **{"Accept-Encoding": "gzip;q=0"})
            assert "Content-Encoding" not in refused_headers
            status, _, body = fetch(path, **{"If-None-Match": plain_headers["ETag"]})
            assert (status, body) == (304, b"")
            status, _, body = fetch(path, **{"If-None-Match": '"something-else"'})
            assert status == 200 and body == plain

        before = fetch("/api/stats/volunteers.json")[2]
        grace = ledger["grace"]
        with db.begin() as session:  # grace hides her profile: this process keeps its copy for now
            session.get(User, grace.id).profile_hidden = True
        assert fetch("/api/stats/volunteers.json")[2] == before
        assert fetch("/api/users/grace")[0] == 404  # profiles are never cached


def test_export_is_regenerated_once_its_copy_is_older_than_the_setting(settings, db, ledger):
    fresh = create_app(settings.model_copy(update={"stats_cache_seconds": 0}))
    with LiveServer(fresh) as server:
        first = json.loads(urllib.request.urlopen(server.url + "/api/stats/volunteers.json").read())
        with db.begin() as session:
            session.get(User, ledger["grace"].id).profile_hidden = True
        second = json.loads(urllib.request.urlopen(server.url + "/api/stats/volunteers.json").read())
    assert [r["username"] for r in first["volunteers"]] == ["ada", "grace"]
    assert [r["username"] for r in second["volunteers"]] == ["ada"]


def test_profile_is_the_same_for_every_viewer(client, db, ledger):
    anonymous = client.get("/api/users/grace").json()
    for name in ("olga", "ada", "grace"):
        assert client.get("/api/users/grace", headers=api_token(client, name)).json() == anonymous
    csrf_from(client.get("/login").text)
    assert "csrf_token" not in client.get("/u/grace").text.split("<main>")[1]  # a page to read, no forms
