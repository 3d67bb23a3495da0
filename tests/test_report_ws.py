"""The workers' metric websocket and the dashboards' live channel, through the TestClient."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import func, select
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from swarmhub.server import experiments
from swarmhub.server.models import MetricPoint, WorkerRun
from swarmhub.worker.protocol import MetricReport

from .conftest import api_token, make_experiment, make_user


def worker_run(db, user, slug):
    with db.begin() as session:
        experiment = experiments.get_visible(session, slug, session.merge(user))
        return experiments.start_worker_run(session, experiment, session.merge(user), "cpu").id


def report(seq, samples=32, loss=2.0):
    return MetricReport(
        seq=seq,
        step=seq,
        epoch=seq // 4,
        samples=samples,
        loss=loss,
        samples_per_second=100.0,
        peers=2,
        averaged_peers=2,
    ).model_dump_json()


@pytest.fixture
def swarm(client, db):
    alice = make_user(db)
    bob = make_user(db, "bob")
    make_experiment(db, alice, slug="live", status="running")
    return {
        "alice": (api_token(client), worker_run(db, alice, "live")),
        "bob": (api_token(client, "bob"), worker_run(db, bob, "live")),
    }


def url(worker_id):
    return f"/ws/experiments/live/report?worker_id={worker_id}"


def stored(db):
    with db() as session:
        return session.scalar(select(func.count(MetricPoint.id)))


def test_reports_are_acked_and_stored_exactly_once(client, db, swarm):
    headers, worker_id = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        for seq in range(3):
            ws.send_text(report(seq, samples=32 * (seq + 1), loss=2.0 - seq * 0.1))
            assert json.loads(ws.receive_text()) == {"type": "ack", "seq": seq}
        ws.send_text(report(1, samples=64))  # a re-sent message after a reconnect
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 1}
    assert stored(db) == 3
    with db() as session:
        run = session.get(WorkerRun, worker_id)
        assert (run.samples, run.last_seq, run.loss) == (96, 2, pytest.approx(1.8))
    board = client.get("/api/experiments/live/leaderboard").json()
    # Claimed only: no monitor peer runs here, so no signed record verifies any of it (and no flags for the public).
    assert [(e["username"], e["claimed_samples"], e["samples"], e["active"], e["flags"]) for e in board] == [
        ("alice", 96, 0, True, None)
    ]
    summary = client.get("/api/experiments/live/metrics").json()["summary"]
    assert (summary["active_peers"], summary["total_samples"]) == (1, 96)


def test_handshake_is_refused_without_valid_credentials(client, swarm):
    headers, worker_id = swarm["alice"]
    bob_headers, bob_worker = swarm["bob"]
    cases = [
        ({}, worker_id, 401),
        ({"Authorization": "Bearer shb_forged"}, worker_id, 401),
        (headers, bob_worker, 403),  # someone else's worker run
        (headers, "unknown", 403),
    ]
    for sent_headers, worker, status in cases:
        with pytest.raises(WebSocketDenialResponse) as denied:
            with client.websocket_connect(url(worker), headers=sent_headers):
                pass
        assert denied.value.status_code == status
    with pytest.raises(WebSocketDenialResponse) as missing:
        with client.websocket_connect("/ws/experiments/nope/report?worker_id=x", headers=headers):
            pass
    assert missing.value.status_code == 404


@pytest.mark.parametrize(
    "message",
    [
        "not json",
        json.dumps({"type": "metrics", "seq": 0}),
        report(0).replace('"loss":2.0', '"loss":NaN'),
        report(0).replace('"peers":2', '"peers":2,"extra":1'),
        json.dumps({"type": "metrics", "pad": "x" * 5000}),
    ],
    ids=["not-json", "missing-fields", "nan-loss", "unknown-field", "oversized"],
)
def test_invalid_messages_close_the_socket_and_store_nothing(client, db, swarm, message):
    headers, worker_id = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(message)
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1008
    assert stored(db) == 0


def test_worker_is_told_when_the_experiment_pauses(client, db, swarm):
    headers, worker_id = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text())["type"] == "ack"
        client.post("/api/experiments/live/status", json={"action": "pause"}, headers=headers)
        ws.send_text(report(1))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 1}
        control = json.loads(ws.receive_text())
    assert control["type"] == "control" and control["status"] == "paused"


def test_live_channel_pushes_new_numbers(client, db, swarm):
    headers, worker_id = swarm["alice"]
    with client.websocket_connect("/ws/experiments/live/live") as viewer:
        first = viewer.receive_json()
        assert first["type"] == "snapshot" and first["leaderboard"] == []
        with client.websocket_connect(url(worker_id), headers=headers) as ws:
            ws.send_text(report(0, samples=32, loss=2.3))
            ws.receive_text()
        update = viewer.receive_json()
    assert update["leaderboard"][0]["username"] == "alice"
    assert update["metrics"]["series"][-1]["loss"] == pytest.approx(2.3)
    assert update["metrics"]["summary"]["total_samples"] == 32


def test_live_channel_hides_drafts(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="hidden")
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/ws/experiments/hidden/live"):
            pass
    assert denied.value.status_code == 404


def test_removed_volunteer_is_told_and_nothing_more_is_stored(client, db, swarm):
    headers, worker_id = swarm["bob"]
    organizer, _ = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text())["type"] == "ack"
        assert client.post("/api/experiments/live/bans", json={"username": "bob"}, headers=organizer).status_code == 204
        ws.send_text(report(1))
        control = json.loads(ws.receive_text())
        with pytest.raises(WebSocketDisconnect):
            ws.receive_text()
    assert control["removed"] is True and control["type"] == "control"
    assert stored(db) == 1
