"""The organizer's swarm view: `GET /api/experiments/{slug}/swarm` and the "Peers in the swarm" section of the
experiment page, filled from the stored signed records, witnessed rounds, flags and worker runs."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from sqlalchemy import update
from starlette.testclient import TestClient

from swarmhub.server import experiments, swarm_view, witnessed
from swarmhub.server.models import Experiment, User, utcnow

from .conftest import api_token, login, make_experiment, make_user
from .support import observe, report, witness

PEER_A1, PEER_A2, PEER_B, PEER_OLD = "QmAliceOne", "QmAliceTwo", "QmBob", "QmCarolGone"


@pytest.fixture
def swarm(client, db):
    """olga's running experiment "live": alice runs two peers (and one cuda worker run that reported), bob one with
    a flag, carol's peer was last read two minutes ago; vera is a volunteer who runs nothing."""
    olga = make_user(db, "olga")
    for name in ("alice", "bob", "carol", "vera"):
        make_user(db, name)
    experiment = make_experiment(db, olga, slug="live", status="running")
    now = utcnow()
    observe(db, experiment.id, now - timedelta(seconds=120), ("carol", PEER_OLD, 0, 64))
    observe(db, experiment.id, now, ("alice", PEER_A1, 0, 320), ("alice", PEER_A2, 0, 160), ("bob", PEER_B, 0, 96))
    witness(db, experiment.id, now, "ab" * 8, 0, [("alice", PEER_A1, 64.0), ("bob", PEER_B, 32.0)])
    with db.begin() as session:
        flag = witnessed.Flag(id="f1", peer_id=PEER_B, username="bob", reason="non-finite gradients", count=3)
        witnessed.record_flags(session, session.get(Experiment, experiment.id), [flag], now)
    headers = api_token(client, "alice")
    worker_id = _start_run(db, experiment.id, "alice")
    with client.websocket_connect(f"/ws/experiments/live/report?worker_id={worker_id}", headers=headers) as ws:
        ws.send_text(report(0))  # samples_per_second=100.0
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
    return experiment.id


def _start_run(db, experiment_id: int, username: str) -> str:
    """A worker run as the join route starts one (the join itself needs a live swarm)."""
    with db.begin() as session:
        user = session.query(User).filter_by(username=username).one()
        return experiments.start_worker_run(session, session.get(Experiment, experiment_id), user, "cuda:0").id


def test_the_organizer_sees_each_peer_with_its_stored_figures(client, swarm):
    response = client.get("/api/experiments/live/swarm", headers=api_token(client, "olga"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["window_seconds"] == 30
    peers = {p["peer_id"]: p for p in body["peers"]}
    assert list(peers) == [PEER_A1, PEER_A2, PEER_B]  # by volunteer, then peer; carol's is outside the window
    alice = peers[PEER_A1]
    assert alice["username"] == "alice"
    assert alice["peak_samples_per_second"] == 40.0
    assert alice["devices"] == ["cuda"]
    assert alice["reported_samples_per_second"] == 100.0
    assert alice["last_round_at"] is not None and peers[PEER_A2]["last_round_at"] is None
    assert alice["flags"] == {}
    assert peers[PEER_B]["flags"] == {"non-finite gradients": 3}
    assert peers[PEER_B]["devices"] == [] and peers[PEER_B]["reported_samples_per_second"] == 0.0
    assert peers[PEER_B]["last_round_at"] is not None


def test_a_peer_read_before_the_window_is_absent_and_only_for_the_window(db, swarm):
    with db() as session:
        experiment = session.get(Experiment, swarm)
        assert [p.peer_id for p in swarm_view.view(session, experiment, 30).peers] == [PEER_A1, PEER_A2, PEER_B]
        wider = swarm_view.view(session, experiment, 300).peers
    assert [(p.username, p.peer_id) for p in wider][-1] == ("carol", PEER_OLD)


def test_an_administrator_sees_it_others_are_refused(client, db, swarm):
    with db.begin() as session:
        session.execute(update(User).where(User.username == "carol").values(is_admin=True))
    assert client.get("/api/experiments/live/swarm", headers=api_token(client, "carol")).status_code == 200
    assert client.get("/api/experiments/live/swarm", headers=api_token(client, "vera")).status_code == 403
    assert client.get("/api/experiments/live/swarm").status_code == 401
    assert client.get("/api/experiments/nope/swarm", headers=api_token(client, "olga")).status_code == 404


def _section(html: str) -> str | None:
    match = re.search(r'<section class="card" id="swarm-view">.*?</section>', html, re.S)
    return match.group(0) if match else None


def test_the_page_section_shows_the_rows_to_the_organizer_only(app, swarm):
    with TestClient(app) as browser:
        login(browser, "olga")
        section = _section(browser.get("/experiments/live").text)
    assert section is not None
    rows = re.findall(r'<tr data-peer="([^"]+)"><td class="volunteer">([^<]*)</td>', section)
    assert rows == [(PEER_A1, "alice"), (PEER_A2, "alice"), (PEER_B, "bob")]
    assert PEER_OLD not in section
    assert "non-finite gradients ×3" in section and "100.0" in section and "cuda" in section
    for who in ("vera", None):
        with TestClient(app) as browser:
            if who:
                login(browser, who)
            page = browser.get("/experiments/live")
        assert page.status_code == 200 and _section(page.text) is None and PEER_A1 not in page.text, who


def test_markup_in_a_username_is_escaped(app, db, swarm):
    with db.begin() as session:  # a name the sign-up form would refuse, as an older or imported account may hold
        session.execute(update(User).where(User.username == "bob").values(username='<img src=x onerror="x()">'))
    with TestClient(app) as browser:
        login(browser, "olga")
        section = _section(browser.get("/experiments/live").text)
    assert section is not None
    assert "<img" not in section
    assert "&lt;img src=x onerror=&#34;x()&#34;&gt;" in section
