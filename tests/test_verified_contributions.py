"""Contributions: the monitor attributes signed progress records to the volunteer whose token holds the signing key
(real peers on 127.0.0.1); the ledger keeps them as pending claims and time online, verifies work only through the
rounds the server's witness saw, and the leaderboard is built from both (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import timedelta

import pytest

from swarmhub.server import experiments, metrics
from swarmhub.server.ledger import contributions, witnessed
from swarmhub.server.models import utcnow

from .conftest import api_token, make_experiment, make_user

pytestmark = pytest.mark.both_databases  # the ledger is an upsert, per dialect

# A peer admitted as USERNAME that publishes one progress record signed by its own key. ``claim`` puts another
# peer's ID in the record's body, as a cheat would; ``roster`` false leaves its token off the roster.
PUBLISHER = """
import json, os, sys, tempfile
from datetime import timedelta
import hivemind
from hivemind.dht.schema import RSASignatureValidator, SchemaValidator
from hivemind.optim.progress_tracker import LocalTrainingProgress, TrainingProgressSchema
from hivemind.p2p import PeerID
from hivemind.utils.timed_storage import get_dht_time
from swarmhub.worker.swarm import access as swarm_access

maddrs, run_id, signing_text, username, epoch, samples, claim, roster = json.loads(sys.argv[1])
signing = swarm_access.signing_key_from_text(signing_text)
identity = os.path.join(tempfile.mkdtemp(), "id.key")
key = swarm_access.load_or_create_identity(__import__("pathlib").Path(identity))
swarm_access.use_as_process_key(key)
token = swarm_access.sign_token(signing, run_id, username, key.get_public_key().to_bytes(), timedelta(minutes=5))
authorizer = swarm_access.SwarmAuthorizer(key, signing.get_public_key(), run_id, lambda: token, first_token=token)
dht = hivemind.DHT(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                   identity_path=identity, start=True)
validator = RSASignatureValidator()
dht.add_validators([SchemaValidator(TrainingProgressSchema, prefix=run_id), validator])
if roster:
    assert swarm_access.publish_roster_entry(dht, run_id, token)
peer_id = PeerID.from_base58(claim).to_bytes() if claim else dht.peer_id.to_bytes()
record = LocalTrainingProgress(peer_id=peer_id, epoch=epoch, samples_accumulated=samples, samples_per_second=40.0,
                               time=get_dht_time(), client_mode=False)
stored = dht.store(f"{run_id}_progress", subkey=validator.local_public_key, value=record.dict(),
                   expiration_time=get_dht_time() + 60)
print(json.dumps({"peer_id": dht.peer_id.to_base58(), "stored": bool(stored)}), flush=True)
sys.stdin.read()  # stay in the swarm until the test is done
dht.shutdown()
"""


@pytest.mark.swarm
def test_monitor_credits_signed_records_to_the_token_holder(swarm_peer):
    run = [swarm_peer.maddrs, swarm_peer.run_id, swarm_peer.key_text]
    specs = {
        "ada": ["ada", 3, 50, None, True],
        "off-roster": ["nobody", 3, 90, None, False],
    }
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, spec in specs.items():
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", PUBLISHER, json.dumps(run + spec)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        ids = {name: json.loads(proc.stdout.readline()) for name, proc in procs.items()}
        assert all(result["stored"] for result in ids.values()), ids
        # mallory's record names ada's peer ID in its body; its own key signs it.
        procs["mallory"] = subprocess.Popen(
            [sys.executable, "-c", PUBLISHER, json.dumps([*run, "mallory", 3, 77, ids["ada"]["peer_id"], True])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        ids["mallory"] = json.loads(procs["mallory"].stdout.readline())
        assert ids["mallory"]["stored"], ids

        deadline, credited = time.monotonic() + 60, {}
        while time.monotonic() < deadline and len(credited) < 2:
            line = swarm_peer.output.next(timeout=max(deadline - time.monotonic(), 0.01))
            event = json.loads(line) if line and line.startswith("{") else {}
            if event.get("event") == "progress":
                credited = {c["peer_id"]: c for c in event.get("contributors", [])}
                peers = event["peers"]
        assert credited.keys() == {ids["ada"]["peer_id"], ids["mallory"]["peer_id"]}, credited
        assert peers == 3  # the off-roster record counts in the swarm's totals, credited to no one
        ada, mallory = credited[ids["ada"]["peer_id"]], credited[ids["mallory"]["peer_id"]]
        assert (ada["username"], ada["epoch"], ada["samples"]) == ("ada", 3, 50)
        assert (mallory["username"], mallory["samples"]) == ("mallory", 77)  # not ada's, whatever it claims

        # The next reads of the records attribute them as before without reading the roster each time: the
        # off-roster record sends the monitor back to it at most every UNKNOWN_SECONDS (5 s), not at every read.
        reads, started = [], time.monotonic()
        while len(reads) < 8:
            line = swarm_peer.output.next(timeout=30)
            event = json.loads(line) if line and line.startswith("{") else {}
            if event.get("event") == "progress":
                assert {c["peer_id"] for c in event["contributors"]} == credited.keys()
                reads.append(event["roster_reads"])
        assert reads[-1] - reads[0] <= (time.monotonic() - started) / 5 + 1, reads
        assert reads[-1] - reads[0] < len(reads) - 1, reads
    finally:
        for proc in procs.values():
            proc.stdin.close()
        for proc in procs.values():
            try:
                assert proc.wait(30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()


def observation(username: str, peer: str, epoch: int, samples: int, at: float, sps: float = 40.0) -> dict:
    return {
        "peer_id": peer,
        "username": username,
        "epoch": epoch,
        "samples": samples,
        "samples_per_second": sps,
        "time": at,
    }


def feed(db, experiment_id: int, observations: list[dict], now) -> None:
    with db.begin() as session:
        experiment = session.get(experiments.Experiment, experiment_id)
        contributions.record(session, experiment, contributions.parse(observations), now)


def witness(db, experiment_id: int, now, *rounds: tuple[str, int, list[tuple[str, str, float]]]) -> int:
    """What the monitor hands over from the server's witness record: rounds of (id, epoch, senders)."""
    items = [
        {"id": round_id, "epoch": epoch, "time": now.timestamp(),
         "senders": [{"username": name, "peer_id": peer, "weight": weight} for name, peer, weight in senders]}
        for round_id, epoch, senders in rounds
    ]  # fmt: skip
    with db.begin() as session:
        experiment = session.get(experiments.Experiment, experiment_id)
        return witnessed.record_rounds(session, experiment, witnessed.parse_rounds(items), now)


def test_records_are_pending_claims_and_time_online_never_verified_work(db):
    organizer, ada, grace = make_user(db, "olga"), make_user(db, "ada"), make_user(db, "grace")
    experiment = make_experiment(db, organizer, slug="ledger", status="running")  # target batch 128
    t0 = utcnow()
    ts = t0.timestamp()
    feed(db, experiment.id, [observation("ada", "QmA", 1, 40, ts), observation("grace", "QmG", 1, 30, ts)], t0)
    # Later reads of the same epoch: the largest count stands (not a sum); no one gets over twice the batch.
    t1 = t0 + timedelta(seconds=2)
    feed(
        db, experiment.id, [observation("ada", "QmA", 1, 90, ts + 2), observation("grace", "QmG", 1, 5000, ts + 2)], t1
    )
    # The swarm moves to epoch 2: epoch 1's claims are dropped (no witnessed round credits them); epoch 2 is pending.
    t2 = t0 + timedelta(seconds=4)
    feed(db, experiment.id, [observation("ada", "QmA", 2, 10, ts + 4), observation("grace", "QmG", 1, 500, ts + 2)], t2)
    # ada's peer goes quiet for a minute, then comes back: the silence is not time online.
    t3 = t0 + timedelta(seconds=64)
    feed(db, experiment.id, [observation("ada", "QmA", 2, 60, ts + 64)], t3)
    with db() as session:
        exp = session.get(experiments.Experiment, experiment.id)
        verified = contributions.by_user(session, exp)
    assert (verified[ada.id].samples, verified[ada.id].pending) == (0, 60)
    assert (verified[grace.id].samples, verified[grace.id].pending) == (0, 0)
    assert verified[ada.id].online_seconds == pytest.approx(4.0)
    assert verified[grace.id].online_seconds == pytest.approx(2.0)  # its record stopped changing at ts + 2
    assert verified[ada.id].last_seen == t3 and verified[grace.id].last_seen == t1


def test_malformed_records_are_ignored():
    parsed = contributions.parse(
        [
            observation("ada", "QmA", 1, 40, 0.0),
            {**observation("ada", "QmA", 1, 40, 0.0), "samples": -1},
            {**observation("ada", "QmA", 1, 40, 0.0), "samples_per_second": float("nan")},
            {"peer_id": "QmA"},
            "junk",
        ]
    )
    assert len(parsed) == 1
    assert contributions.parse("junk") == []


def report(client, headers, worker_id: str, seq: int, samples: int, sps: float) -> None:
    with client.websocket_connect(f"/ws/experiments/ledger/report?worker_id={worker_id}", headers=headers) as ws:
        message = {
            "type": "metrics",
            "seq": seq,
            "step": seq,
            "epoch": 1,
            "samples": samples,
            "loss": 2.0,
            "samples_per_second": sps,
            "peers": 2,
        }
        ws.send_text(json.dumps(message))
        assert json.loads(ws.receive_text())["type"] == "ack"


def test_leaderboard_ranks_verified_work_and_flags_implausible_claims_for_the_organizer(db, client):
    organizer = make_user(db, "olga")
    ada, grace, mallory = make_user(db, "ada"), make_user(db, "grace"), make_user(db, "mallory")
    experiment = make_experiment(db, organizer, slug="ledger", status="running")
    workers = {}
    with db.begin() as session:
        exp = session.get(experiments.Experiment, experiment.id)
        for user in (ada, grace, mallory):
            workers[user.username] = experiments.start_worker_run(session, exp, session.merge(user), "cpu").id
    now = utcnow()
    ts = now.timestamp()
    # Signed records: ada did epochs 1-3 fully, grace a little of each; the swarm is in epoch 4.
    feed(
        db,
        experiment.id,
        [observation("ada", "QmA", e, 100, ts, sps=50.0) for e in (1, 2, 3)]
        + [observation("grace", "QmG", e, 28, ts, sps=15.0) for e in (1, 2, 3, 4)]
        + [observation("mallory", "QmM", 2, 20, ts, sps=12.0)],  # mallory's peer did a little real work
        now,
    )
    # The server's witness saw the rounds that closed epochs 1-3, each 10 s apart, and who sent what in them.
    for epoch in (1, 2, 3):
        senders = [("ada", "QmA", 100.0), ("grace", "QmG", 28.0)] + ([("mallory", "QmM", 20.0)] if epoch == 2 else [])
        assert witness(db, experiment.id, now + timedelta(seconds=10 * epoch), (f"round-{epoch}", epoch, senders)) == 1
    report(client, api_token(client, "ada"), workers["ada"], 0, 310, 48.0)
    report(client, api_token(client, "grace"), workers["grace"], 0, 112, 16.0)
    # mallory's worker claims far more, and far faster, than the swarm saw it do.
    report(client, api_token(client, "mallory"), workers["mallory"], 0, 50_000, 900.0)

    public = client.get("/api/experiments/ledger/leaderboard").json()
    # Each peer is credited at most what the fastest peer of another volunteer of its class gained over the same
    # minutes: ada's 100 a round is held to grace's 28 (the fastest honest peer of a class cannot be told from a
    # forger claiming its speed), and mallory's 20 is hers in full.
    assert [(e["username"], e["samples"], e["pending_samples"], e["claimed_samples"]) for e in public] == [
        ("ada", 84, 0, 310),
        ("grace", 84, 28, 112),
        ("mallory", 20, 0, 50_000),  # ranked by what the swarm saw, not by what it claimed
    ]
    shares = [e["share"] for e in public]
    assert shares == [pytest.approx(n / 188, abs=1e-4) for n in (84, 84, 20)]
    assert all(e["flags"] is None for e in public)  # the public never sees flags

    as_volunteer = client.get("/api/experiments/ledger/leaderboard", headers=api_token(client, "grace")).json()
    assert all(e["flags"] is None for e in as_volunteer)

    board = client.get("/api/experiments/ledger/leaderboard", headers=api_token(client, "olga")).json()
    flags = {e["username"]: e["flags"] for e in board}
    assert flags["ada"] == [] and flags["grace"] == []
    assert len(flags["mallory"]) == 2
    assert "never reached an averaging round" in flags["mallory"][0]
    assert "900 samples/s" in flags["mallory"][1] and "cpu" in flags["mallory"][1]

    summary = client.get("/api/experiments/ledger/metrics").json()["summary"]
    assert (summary["verified_samples"], summary["total_samples"]) == (188, 50_422)
    assert metrics.device_class("cuda:1") == "cuda"


def test_a_claim_is_flagged_however_fast_the_claimer_signs_its_own_records(db, client):
    """A modified worker signs whatever rate it likes in its own progress records: over many short epochs that rate
    once excused any claim as "the monitor's unseen tail" (1,000,000 samples claimed, none verified, no flag)."""
    organizer, mallory = make_user(db, "olga"), make_user(db, "mallory")
    experiment = make_experiment(db, organizer, slug="ledger", status="running")  # target batch 128
    with db.begin() as session:
        exp = session.get(experiments.Experiment, experiment.id)
        worker = experiments.start_worker_run(session, exp, session.merge(mallory), "cpu").id
    now = utcnow()
    ts = now.timestamp()
    # 60 epochs of records signed at a million samples a second, with a few samples each; no round witnessed.
    for epoch in range(1, 61):
        feed(db, experiment.id, [observation("mallory", "QmM", epoch, 5, ts + epoch, sps=1e6)], now)
    report(client, api_token(client, "mallory"), worker, 0, 1_000_000, 100.0)
    board = client.get("/api/experiments/ledger/leaderboard", headers=api_token(client, "olga")).json()
    (row,) = board
    assert (row["username"], row["samples"], row["claimed_samples"]) == ("mallory", 0, 1_000_000)
    assert any("claims 1,000,000 samples" in flag for flag in row["flags"]), row
