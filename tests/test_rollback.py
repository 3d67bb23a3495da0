"""Rolling a swarm back to a kept checkpoint, through the API and the experiment's page: only the organizer (or an
administrator) may, only to a checkpoint whose files are kept, and the request reaches the file the server's
checkpoint peer reads. The swarm loading it is shown end to end in tests/e2e/test_albert_e2e.py."""

from __future__ import annotations

import json

import pytest
from starlette.testclient import TestClient

from swarmhub.server.corpus import training_data
from swarmhub.server.experiments import rollback
from swarmhub.server.models import Experiment
from swarmhub.server.swarm import SwarmHost

from .conftest import PASSWORD, api_token, csrf_from, make_experiment, make_user


@pytest.fixture
def world(db, settings):
    users = {name: make_user(db, name) for name in ("root", "olga", "otto", "vera")}  # root first: the administrator
    make_experiment(db, users["olga"], slug="albert", status="running", task="albert-mlm")
    make_experiment(db, users["olga"], slug="digits", status="running")
    with db.begin() as session:
        albert = session.query(Experiment).filter_by(slug="albert").one()
        for epoch, loss in ((5, 7.0), (10, 6.9), (20, 6.5), (30, 6.1)):  # the oldest is pruned (3 kept)
            training_data.record_checkpoint(session, settings, albert, epoch, loss, f"run/{epoch:010d}")
    return users


def restore_state(db, slug: str = "albert") -> tuple[int | None, int]:
    with db() as session:
        experiment = session.query(Experiment).filter_by(slug=slug).one()
        return experiment.restore_epoch, experiment.restore_seq


def test_only_the_organizer_or_an_administrator_rolls_back(client, db, world):
    for name, expected in (("vera", 403), ("otto", 403), ("olga", 202), ("root", 202)):
        response = client.post("/api/experiments/albert/rollback", headers=api_token(client, name), json={"epoch": 10})
        assert response.status_code == expected, (name, response.text)
    assert client.post("/api/experiments/albert/rollback", json={"epoch": 10}).status_code == 401
    assert restore_state(db) == (10, 2)  # two restores asked for, by olga and by root


def test_a_rollback_names_what_is_wrong_and_changes_nothing(client, db, world):
    olga = api_token(client, "olga")
    pruned = client.post("/api/experiments/albert/rollback", headers=olga, json={"epoch": 5})
    assert pruned.status_code == 400 and pruned.json()["field"] == "epoch", pruned.text
    assert "kept: 30, 20, 10" in pruned.json()["detail"]
    negative = client.post("/api/experiments/albert/rollback", headers=olga, json={"epoch": -1})
    assert negative.status_code == 422 and "epoch" in negative.text
    digits = client.post("/api/experiments/digits/rollback", headers=olga, json={"epoch": 10})
    assert digits.status_code == 400 and "keeps no checkpoints" in digits.json()["detail"]
    with db.begin() as session:
        session.query(Experiment).filter_by(slug="albert").one().status = "finished"
    finished = client.post("/api/experiments/albert/rollback", headers=olga, json={"epoch": 10})
    assert finished.status_code == 409, finished.text
    assert restore_state(db) == (None, 0)


def test_the_organizer_rolls_back_from_the_page(app, db, world):
    with TestClient(app) as browser:
        csrf = csrf_from(browser.get("/login").text)
        browser.post("/login", data={"username": "olga", "password": PASSWORD, "csrf_token": csrf})
        page = browser.get("/experiments/albert").text
        assert 'id="rollback-form"' in page and "step 30, held-out loss 6.100" in page and "step 5," not in page
        csrf = csrf_from(page)
        done = browser.post(
            "/experiments/albert/rollback", data={"epoch": "20", "csrf_token": csrf}, follow_redirects=False
        )
        assert done.status_code == 303, done.text
        missing = browser.post("/experiments/albert/rollback", data={"epoch": "x", "csrf_token": csrf})
        assert missing.status_code == 400 and "choose one of the kept checkpoints" in missing.text
    assert restore_state(db) == (20, 1)
    with TestClient(app) as visitor:  # no form for anyone else
        assert 'id="rollback-form"' not in visitor.get("/experiments/albert").text


def test_the_request_reaches_the_checkpoint_peer_s_file_once_per_change(client, db, world, tmp_path):
    client.post("/api/experiments/albert/rollback", headers=api_token(client, "olga"), json={"epoch": 20})
    with db() as session:
        order = rollback.restore_order(session.query(Experiment).filter_by(slug="albert").one())
    host = SwarmHost(tmp_path, "127.0.0.1")
    host.write_restore("run", order)
    assert json.loads(host.restore_file("run").read_text()) == {"seq": 1, "epoch": 20}
    host.write_restore("run", None)  # an experiment with no rollback: an empty file, which the peer ignores
    assert host.restore_file("run").read_text() == ""
