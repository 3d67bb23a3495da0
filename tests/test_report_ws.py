"""The workers' metric websocket and the dashboards' live channel, through the TestClient."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import delete, func, select
from starlette.testclient import WebSocketDenialResponse
from starlette.websockets import WebSocketDisconnect

from swarmhub.server.models import ExperimentTotal, MetricPoint, WorkerRun
from swarmhub.server.routes.ws import MAX_BURST, MAX_IN_FLIGHT, MAX_MESSAGES_PER_SECOND
from swarmhub.server.services import services

from .conftest import api_token, make_experiment, make_user
from .support import report, url, worker_run

pytestmark = pytest.mark.both_databases  # ingestion, per dialect


@pytest.fixture
def swarm(client, db):
    alice = make_user(db)
    bob = make_user(db, "bob")
    make_experiment(db, alice, slug="live", status="running")
    return {
        "alice": (api_token(client), worker_run(db, alice, "live")),
        "bob": (api_token(client, "bob"), worker_run(db, bob, "live")),
    }


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


# Pipelined reports: the worker sends without waiting for acks; the socket reads ahead while earlier reports
# wait for their transaction, and acks are cumulative. The server closes a socket that sends more than
# MAX_MESSAGES_PER_SECOND messages a second on average (a token bucket, counted as it reads them, with room for
# MAX_BURST at once), so a test sends at most that many between two pauses of a second.


def send(ws, seqs):
    for seq in seqs:
        ws.send_text(report(seq, samples=10 * (seq + 1), loss=3.0 - seq / 1000))


def acks_until(ws, last):
    """The seqs of the acks received up to the ack of ``last``; fails on anything else."""
    acked = []
    while not acked or acked[-1] != last:
        message = json.loads(ws.receive_text())
        assert message["type"] == "ack", message
        acked.append(message["seq"])
    return acked


def stored_seqs(db, worker_id):
    with db() as session:
        return list(
            session.scalars(select(MetricPoint.seq).where(MetricPoint.worker_run_id == worker_id).order_by("seq"))
        )


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.01)


def test_pipelined_reports_get_cumulative_acks_in_order_and_are_stored_once(client, db, swarm):
    headers, worker_id = swarm["alice"]
    sent, acked = [], []
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        for start in range(0, 200, MAX_MESSAGES_PER_SECOND):
            seqs = range(start, start + MAX_MESSAGES_PER_SECOND)
            send(ws, seqs)  # back to back, no waiting for acks
            sent += seqs
            acked += acks_until(ws, seqs[-1])
            time.sleep(1.05)
        ws.send_text(report(120, samples=1210))  # re-sent after its ack: acked again, stored once
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 120}
    assert len(sent) == 200 and acked[-1] == 199
    # Fewer acks than reports only because one ack answers every report up to its seq
    assert acked == sorted(set(acked)) and set(acked) <= set(sent)
    assert stored_seqs(db, worker_id) == sent
    with db() as session:
        run = session.get(WorkerRun, worker_id)
        assert (run.last_seq, run.samples, run.epoch, run.loss) == (199, 2000, 199 // 4, pytest.approx(3.0 - 0.199))
        assert run.last_stored_at is not None
    summary = client.get("/api/experiments/live/metrics").json()["summary"]
    assert (summary["active_peers"], summary["total_samples"]) == (1, 2000)


def test_pipelined_reports_of_a_paused_experiment_get_the_control_after_each_ack(client, db, swarm):
    headers, worker_id = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
        client.post("/api/experiments/live/status", json={"action": "pause"}, headers=headers)
        send(ws, range(1, 21))
        messages = []
        while not messages or messages[-1] != {"type": "ack", "seq": 20}:
            messages.append(json.loads(ws.receive_text()))
        messages.append(json.loads(ws.receive_text()))
    acks, controls = messages[0::2], messages[1::2]
    assert [m["type"] for m in acks] == ["ack"] * len(acks)
    assert [a["seq"] for a in acks] == sorted({a["seq"] for a in acks}) and acks[-1]["seq"] == 20
    assert [(c["type"], c["status"], c["removed"]) for c in controls] == [("control", "paused", False)] * len(acks)
    assert stored_seqs(db, worker_id) == list(range(21))  # a paused experiment still stores what was sent


def test_pipelined_reports_of_a_removed_volunteer_are_not_stored_and_the_socket_is_closed(client, db, swarm):
    headers, worker_id = swarm["bob"]
    organizer, _ = swarm["alice"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
        assert client.post("/api/experiments/live/bans", json={"username": "bob"}, headers=organizer).status_code == 204
        send(ws, range(1, 21))
        control = json.loads(ws.receive_text())  # no ack first: none of them was stored
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert (control["type"], control["removed"]) == ("control", True)
    assert closed.value.code == 1008
    assert stored_seqs(db, worker_id) == [0]


@contextlib.contextmanager
def database_held(db: Any, experiment_id: int) -> Iterator[None]:
    """Another connection holds what a batch of reports for the experiment must write: on PostgreSQL the
    experiment's totals row (every batch locks it first), on SQLite the database's write lock."""
    engine = db.kw["bind"]
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(
                select(ExperimentTotal).where(ExperimentTotal.experiment_id == experiment_id).with_for_update()
            )
            yield
            conn.rollback()
    else:
        raw = engine.raw_connection()
        try:
            raw.driver_connection.execute("BEGIN IMMEDIATE")
            yield
            raw.driver_connection.execute("ROLLBACK")
        finally:
            raw.close()


def test_a_socket_stops_reading_at_max_in_flight_while_the_database_is_busy_and_loses_nothing(app, client, db, swarm):
    headers, worker_id = swarm["alice"]
    writer = services(app).reports
    with db() as session:
        experiment_id = session.get(WorkerRun, worker_id).experiment_id
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))  # stores the experiment's totals row, which database_held locks on PostgreSQL
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
        with database_held(db, experiment_id):
            ws.send_text(report(1))
            time.sleep(1.05)  # the writer takes seq 1 alone, and waits for the database
            send(ws, range(2, 50))  # 48: with seq 0 and 1, at most 50 in any second
            wait_until(lambda: writer._queue.qsize() == 48, "the socket read all 48")
            time.sleep(1.05)
            # 50 more: the socket reads up to MAX_IN_FLIGHT unacknowledged (seq 1 to 64) and then stops reading
            send(ws, range(50, 100))
            wait_until(lambda: writer._queue.qsize() >= MAX_IN_FLIGHT - 1, "the socket read up to seq 64")
            queued = writer._queue.qsize()
            time.sleep(0.3)
            # Seq 1 waits in the writer's batch, seq 2 to 64 are queued, and the socket reads no further (it hands
            # the report it read last to the writer before it waits for room: seq 65 may be queued too)
            assert writer._queue.qsize() == queued and queued in (MAX_IN_FLIGHT - 1, MAX_IN_FLIGHT)
            assert stored_seqs(db, worker_id) == [0]
        acked = acks_until(ws, 99)
        time.sleep(1.05)
        send(ws, [100])  # the socket is still open
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 100}
    assert acked == sorted(set(acked)) and set(acked) <= set(range(1, 100))
    assert stored_seqs(db, worker_id) == list(range(101))
    with db() as session:
        assert session.get(WorkerRun, worker_id).samples == 1010


def drain_acks(ws, last_seq):
    """Read until the ack of ``last_seq``; returns the messages, or raises WebSocketDisconnect."""
    messages = []
    while not messages or messages[-1] != {"type": "ack", "seq": last_seq}:
        messages.append(json.loads(ws.receive_text()))
    return messages


def test_a_flood_is_closed_for_too_many_messages(client, db, swarm):
    headers, worker_id = swarm["alice"]
    flood = MAX_BURST + 2 * MAX_MESSAGES_PER_SECOND + 50
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        send(ws, range(flood))
        with pytest.raises(WebSocketDisconnect) as closed:
            drain_acks(ws, flood - 1)
    assert (closed.value.code, closed.value.reason) == (1008, "too many messages")
    # What was read before the close is still stored (and would be acknowledged on the worker's next
    # connection): wait for the writer's last batch, then count.
    stored, deadline = stored_seqs(db, worker_id), time.monotonic() + 10
    while time.monotonic() < deadline:
        time.sleep(0.3)
        stored, before = stored_seqs(db, worker_id), stored
        if stored == before:
            break
    assert MAX_BURST <= len(stored) < flood and stored == list(range(len(stored)))


def test_a_backlog_read_after_a_stalled_database_is_not_a_flood(client, db, swarm):
    """While the database is held the socket stops reading (MAX_IN_FLIGHT); what the worker sent meanwhile at
    its re-send pace (20 a second) is then read in one go: every report is stored and acknowledged."""
    headers, worker_id = swarm["alice"]
    with db() as session:
        experiment_id = session.get(WorkerRun, worker_id).experiment_id
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
        with database_held(db, experiment_id):
            for second in range(7):  # 140 reports: more than MAX_IN_FLIGHT + MAX_MESSAGES_PER_SECOND
                send(ws, range(1 + 20 * second, 21 + 20 * second))
                time.sleep(1.0)
        drain_acks(ws, 140)
        ws.send_text(report(141))
        assert drain_acks(ws, 141)[-1] == {"type": "ack", "seq": 141}
    assert stored_seqs(db, worker_id) == list(range(142))


def test_a_report_that_cannot_be_stored_closes_the_socket_with_1011_and_is_not_acked(client, db, swarm):
    """The worker run disappears between the handshake and a report (its experiment was deleted): the report
    fails alone, is not acknowledged, and the socket closes with 1011 so the worker re-sends it elsewhere."""
    headers, worker_id = swarm["alice"]
    other_headers, other_worker = swarm["bob"]
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        ws.send_text(report(0))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
        with db.begin() as session:
            session.execute(delete(MetricPoint).where(MetricPoint.worker_run_id == worker_id))
            session.execute(delete(WorkerRun).where(WorkerRun.id == worker_id))
        ws.send_text(report(1))
        with pytest.raises(WebSocketDisconnect) as closed:
            ws.receive_text()
    assert closed.value.code == 1011 and "re-send it" in closed.value.reason
    with client.websocket_connect(url(other_worker), headers=other_headers) as ws:  # the others go on
        ws.send_text(report(0))
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}


def test_a_socket_whose_login_is_revoked_is_closed_and_its_reconnect_refused(app, client, db, swarm, monkeypatch):
    """A login revoked while its worker's report socket is open (a leaked token revoked on the account page, or
    `swarmhub logout`): the socket checks the login again every ``login_recheck_seconds`` and closes (1008, saying to
    log in again), and the reconnect is refused with 401, which stops the worker (the reporter's fatal error).
    Without the check the open socket would store whatever the revoked token sends for as long as it stays open.
    The other volunteer's socket goes on."""
    monkeypatch.setattr(services(app).settings, "login_recheck_seconds", 0.3)
    headers, worker_id = swarm["bob"]
    other_headers, other_id = swarm["alice"]
    with client.websocket_connect(url(other_id), headers=other_headers) as other:
        with client.websocket_connect(url(worker_id), headers=headers) as ws:
            ws.send_text(report(0))
            assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}
            assert client.delete("/api/auth/token", headers=headers).status_code == 204
            with pytest.raises(WebSocketDisconnect) as closed:
                ws.receive_text()
        time.sleep(0.7)  # more checks of the other login
        other.send_text(report(0))
        assert json.loads(other.receive_text()) == {"type": "ack", "seq": 0}
    assert closed.value.code == 1008
    assert "run `swarmhub login` again" in closed.value.reason
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect(url(worker_id), headers=headers):
            pass
    assert refused.value.status_code == 401
    assert stored(db) == 2
