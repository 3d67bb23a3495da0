"""The organizer's swarm view: `GET /api/experiments/{slug}/swarm` and the "Peers in the swarm" section of the
experiment page, filled from the stored signed records, witnessed rounds, flags and worker runs."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select, update
from starlette.testclient import TestClient

from swarmhub import __version__
from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.protocol import JoinRequest, PeerRole, Precision
from swarmhub.server import experiments
from swarmhub.server.app import create_app
from swarmhub.server.ledger import witnessed
from swarmhub.server.metrics import swarm_view
from swarmhub.server.models import Experiment, SwarmLease, User, WorkerRun, utcnow
from swarmhub.worker.client import ApiClient

from .conftest import LiveServer, api_token, login, make_experiment, make_user
from .support import observe, report, witness

PEER_A1, PEER_A2, PEER_B, PEER_OLD = "QmAliceOne", "QmAliceTwo", "QmBob", "QmCarolGone"
BOOTSTRAP = "/ip4/127.0.0.1/tcp/4242/p2p/QmBootstrap"


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
    # alice's run recorded no peer (started as before 0022): its figures are hers, shown with each of her peers
    assert alice["run_match"] == "volunteer" and peers[PEER_A2]["run_match"] == "volunteer"
    assert alice["devices"] == ["cuda"]
    assert alice["reported_samples_per_second"] == 100.0
    assert (alice["precision"], alice["client_mode"], alice["role"], alice["bandwidth_mbps"]) == (None,) * 4
    assert alice["last_round_at"] is not None and peers[PEER_A2]["last_round_at"] is None
    assert alice["flags"] == {}
    assert peers[PEER_B]["flags"] == {"non-finite gradients": 3}
    assert peers[PEER_B]["devices"] == [] and peers[PEER_B]["reported_samples_per_second"] == 0.0
    assert peers[PEER_B]["run_match"] == "none"
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
    assert section.count("(per volunteer)") == 2  # alice's two peers: her run recorded no peer
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


@pytest.fixture
def hub(settings, db, swarm):
    """A server that answers joins (swarms on) for "live", whose swarm another server process hosts: its lease holds
    the bootstrap address, so the join needs no peer of this process."""
    with db.begin() as session:
        run_id = experiments.run_id(session.get(Experiment, swarm))
        expires = utcnow() + timedelta(hours=1)
        session.add(SwarmLease(run_id=run_id, holder="another-replica", expires_at=expires, maddrs=[BOOTSTRAP]))
    with LiveServer(create_app(settings.model_copy(update={"swarm_enabled": True}))) as live:
        yield live


def _bearer(client, username: str) -> str:
    return api_token(client, username)["Authorization"].removeprefix("Bearer ")


def _peer_key() -> str:
    return swarm_tokens.public_key_text(swarm_tokens.SigningKey.generate())


FIGURES = ("run_match", "devices", "precision", "client_mode", "role", "bandwidth_mbps", "reported_samples_per_second")


def test_what_a_join_reports_is_shown_per_peer(client, db, hub, swarm):
    """bob's worker joins with two keys, as `swarmhub join` sends its join: a bf16 trainer on CUDA and an auxiliary
    peer on a CPU; both peers are then read in the swarm, and the trainer reports."""
    trainer_key, aux_key = _peer_key(), _peer_key()
    trainer_id, aux_id = (swarm_tokens.peer_id_for_public_key(key.encode()) for key in (trainer_key, aux_key))
    with ApiClient(hub.url, _bearer(client, "bob")) as api:
        trainer = api.join(
            "live",
            JoinRequest(
                device="cuda",
                client_version=__version__,
                peer_public_key=trainer_key,
                precision=Precision.bf16,
                client_mode=False,
                role=PeerRole.trainer,
                bandwidth_mbps=87.5,
            ),
        )
        aux = api.join(
            "live",
            JoinRequest(device="cpu", peer_public_key=aux_key, client_mode=False, role="auxiliary", bandwidth_mbps=940),
        )
    assert trainer.initial_peers == [BOOTSTRAP]
    with db() as session:  # the peer ID is the server's own derivation from the key the swarm token binds
        stored = dict(session.execute(select(WorkerRun.id, WorkerRun.peer_id)).tuples().all())
    assert stored[trainer.worker_id] == trainer_id and stored[aux.worker_id] == aux_id
    observe(db, swarm, utcnow(), ("bob", trainer_id, 0, 64), ("bob", aux_id, 0, 0))
    headers = api_token(client, "bob")
    with client.websocket_connect(f"/ws/experiments/live/report?worker_id={trainer.worker_id}", headers=headers) as ws:
        ws.send_text(report(0))  # samples_per_second=100.0
        assert json.loads(ws.receive_text()) == {"type": "ack", "seq": 0}

    body = client.get("/api/experiments/live/swarm", headers=api_token(client, "olga")).json()
    peers = {p["peer_id"]: p for p in body["peers"]}
    assert [peers[trainer_id][k] for k in FIGURES] == ["peer", ["cuda"], "bf16", False, "trainer", 87.5, 100.0]
    assert [peers[aux_id][k] for k in FIGURES] == ["peer", ["cpu"], None, False, "auxiliary", 940.0, 0.0]
    # bob's first peer has no run of its own, and bob no run without a peer: the trainer's figures are not its
    assert [peers[PEER_B][k] for k in FIGURES] == ["none", [], None, None, None, None, 0.0]

    with TestClient(client.app) as browser:
        login(browser, "olga")
        section = _section(browser.get("/experiments/live").text)
    assert section is not None
    row = re.search(rf'<tr data-peer="{trainer_id}">.*?</tr>', section, re.S)
    assert row is not None
    cells = dict(re.findall(r'<td class="(\w+)">([^<]*)</td>', row.group(0)))
    assert {k: cells[k] for k in ("device", "precision", "reachable", "role", "bandwidth", "reported")} == {
        "device": "cuda",
        "precision": "bf16",
        "reachable": "reachable",
        "role": "trainer",
        "bandwidth": "87.5 Mbit/s",
        "reported": "100.0",
    }

    with ApiClient(hub.url, _bearer(client, "bob")) as api:  # the trainer restarts (same key) in client mode
        api.join("live", JoinRequest(device="cuda:1", peer_public_key=trainer_key, precision="fp16", client_mode=True))
    restarted = client.get("/api/experiments/live/swarm", headers=api_token(client, "olga")).json()["peers"]
    newest = next(p for p in restarted if p["peer_id"] == trainer_id)
    assert [newest[k] for k in FIGURES] == ["peer", ["cuda"], "fp16", True, None, None, 0.0]  # not reported yet


def test_a_join_without_the_optional_report_fields_still_works(client, db, hub, swarm):
    """The report fields are optional (a script of the API need not send them): the peer is stored without them."""
    key = _peer_key()
    response = httpx.post(
        f"{hub.url}/api/experiments/live/join",
        json={"device": "cpu", "client_version": __version__, "peer_public_key": key},
        headers=api_token(client, "carol"),
    )
    assert response.status_code == 200, response.text
    peer_id = swarm_tokens.peer_id_for_public_key(key.encode())
    with db() as session:
        run = session.get(WorkerRun, response.json()["worker_id"])
        assert run is not None
        assert (run.peer_id, run.precision, run.client_mode, run.role, run.bandwidth_mbps) == (peer_id, *(None,) * 4)
    observe(db, swarm, utcnow(), ("carol", peer_id, 0, 32))
    peers = client.get("/api/experiments/live/swarm", headers=api_token(client, "olga")).json()["peers"]
    carol = next(p for p in peers if p["peer_id"] == peer_id)
    assert [carol[k] for k in FIGURES] == ["peer", ["cpu"], None, None, None, None, 0.0]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("precision", "fp8"),
        ("precision", "BF16"),
        ("precision", ""),
        ("client_mode", "sometimes"),
        ("role", "witness"),
        ("role", "x" * 10_000),
        ("bandwidth_mbps", 0),
        ("bandwidth_mbps", -5.0),
        ("bandwidth_mbps", 1e7),
        ("bandwidth_mbps", "fast"),
        ("peer_id", "QmNotMine"),  # the server derives the peer ID from the key; it takes none from the worker
    ],
)
def test_a_join_with_a_bad_report_is_refused_naming_the_field(client, db, swarm, field, value):
    body = {"device": "cpu", "peer_public_key": _peer_key(), field: value}
    response = client.post("/api/experiments/live/join", json=body, headers=api_token(client, "bob"))
    assert response.status_code == 422, response.text
    assert [err["loc"] for err in response.json()["detail"]] == [["body", field]]
    with db() as session:
        assert session.scalar(select(WorkerRun.id).where(WorkerRun.peer_id.is_not(None))) is None


class _OlderJoinBody(BaseModel):
    """The join body of a server older than the reported fields: it forbids the fields it does not know."""

    model_config = ConfigDict(extra="forbid")
    device: str = "cpu"
    client_version: str = ""
    peer_public_key: str


def test_the_worker_joins_a_server_older_than_the_reported_fields_without_them():
    received: list[dict] = []
    older = FastAPI()

    @older.post("/api/experiments/{slug}/join")
    def join(slug: str, body: _OlderJoinBody) -> dict:
        received.append(body.model_dump())
        token = {"username": "bob", "public_key": body.peer_public_key, "expiration_time": "x", "signature": "s"}
        return {
            "experiment": {"slug": slug, "title": "Older"},
            "run_id": slug,
            "initial_peers": [BOOTSTRAP],
            "worker_id": "w1",
            "username": "bob",
            "report_path": f"/ws/experiments/{slug}/report",
            "swarm_token": token,
            "token_path": f"/api/experiments/{slug}/swarm-token",
            "experiment_public_key": "k",
            "server_time": 0.0,
        }

    key = "ssh-rsa " + "A" * 80
    request = JoinRequest(peer_public_key=key, precision="fp32", role="trainer", client_mode=True, bandwidth_mbps=5)
    with LiveServer(older) as live, ApiClient(live.url, "shb_token") as api:
        assert api.join("live", request).worker_id == "w1"
    assert received == [{"device": "cpu", "client_version": "", "peer_public_key": key}]
