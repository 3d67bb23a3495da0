"""Swarm access: token bytes and checks, and rogue peers (real processes on 127.0.0.1) that a swarm refuses."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker import swarm_access

RUN = "swarmhub-demo-1"


def test_payload_is_the_documented_bytes():
    payload = swarm_access.token_payload(RUN, "ada", b"ssh-rsa AAAAB3Nza", "2026-12-01T10:00:00Z")
    assert payload == (
        b"swarmhub-access-token/v1\nrun_id=swarmhub-demo-1\nusername=ada\n"
        b"public_key=ssh-rsa AAAAB3Nza\nexpires=2026-12-01T10:00:00Z"
    )
    with pytest.raises(ValueError):
        swarm_access.token_payload(RUN, "ada\nusername=root", b"ssh-rsa AAAA", "2026-12-01T10:00:00Z")


def test_tokens_verify_only_for_their_experiment_key_and_lifetime():
    experiment, other = RSAPrivateKey(), RSAPrivateKey()
    peer = RSAPrivateKey().get_public_key().to_bytes()
    good = swarm_access.sign_token(experiment, RUN, "ada", peer, timedelta(minutes=5))
    key = experiment.get_public_key()
    assert swarm_access.verify_token(good, key, RUN)
    assert not swarm_access.verify_token(good, key, "swarmhub-other-2")
    assert not swarm_access.verify_token(good, other.get_public_key(), RUN)
    expired = swarm_access.sign_token(experiment, RUN, "ada", peer, timedelta(seconds=-1))
    assert not swarm_access.verify_token(expired, key, RUN)
    forged = swarm_access.token_from_wire({**swarm_access.token_to_wire(good), "username": "grace"})
    assert not swarm_access.verify_token(forged, key, RUN)
    wire = swarm_access.token_to_wire(good)
    assert swarm_access.verify_token(swarm_access.token_from_wire(json.loads(json.dumps(wire))), key, RUN)


def test_identity_key_is_stable_and_private(tmp_path):
    path = tmp_path / "ids" / "run.key"
    first = swarm_access.load_or_create_identity(path)
    again = swarm_access.load_or_create_identity(path)
    assert first.get_public_key().to_bytes() == again.get_public_key().to_bytes()
    assert path.stat().st_mode & 0o777 == 0o400
    assert swarm_access.peer_id_of(path)  # hivemind derives the peer ID from the same key


# A peer that tries to enter the swarm with what the test gives it; the authorizer is a rogue one that
# does not check its own token (an honest one refuses to send a bad token at all).
ROGUE = """
import json, sys
from datetime import timedelta
import hivemind
from hivemind.utils.timed_storage import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from swarmhub.worker import swarm_access

maddrs, run_id, signing_text, case = json.loads(sys.argv[1])
signing = swarm_access.signing_key_from_text(signing_text)
me = RSAPrivateKey()
pk = me.get_public_key().to_bytes()
tokens = {
    "valid": lambda: swarm_access.sign_token(signing, run_id, "ada", pk, timedelta(minutes=5)),
    "other-key": lambda: swarm_access.sign_token(RSAPrivateKey(), run_id, "ada", pk, timedelta(minutes=5)),
    "expired": lambda: swarm_access.sign_token(signing, run_id, "ada", pk, timedelta(seconds=-30)),
    "other-experiment": lambda: swarm_access.sign_token(signing, run_id + "-x", "ada", pk, timedelta(minutes=5)),
    "someone-elses-key": lambda: swarm_access.sign_token(
        signing, run_id, "ada", RSAPrivateKey().get_public_key().to_bytes(), timedelta(minutes=5)),
}

class Rogue(swarm_access.SwarmAuthorizer):
    def is_token_valid(self, token):
        return True

authorizer = None
if case != "no-token":
    authorizer = Rogue(me, signing.get_public_key(), run_id, tokens[case])
try:
    dht = hivemind.DHT(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                       start=True)
except Exception as exc:
    print(json.dumps({"case": case, "entered": False, "error": type(exc).__name__}))
    sys.exit(0)
stored = dht.store(f"{run_id}_rogue", "hello", get_dht_time() + 30)
seen = dht.get(f"{run_id}_rogue", latest=True)
print(json.dumps({"case": case, "entered": True, "stored": bool(stored), "read": seen is not None}))
dht.shutdown()
"""


@pytest.fixture
def server_peer(tmp_path: Path):
    key_text = swarm_access.new_signing_key_der()
    (tmp_path / "signing").write_text(key_text)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmhub.server.swarm_peer",
            "--run-id",
            run_id,
            "--host",
            "127.0.0.1",
            "--signing-key-file",
            str(tmp_path / "signing"),
            "--identity",
            str(tmp_path / "peer.key"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready"
        yield ready["maddrs"], run_id, key_text
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.swarm
@pytest.mark.parametrize("case", ["valid", "no-token", "other-key", "expired", "other-experiment", "someone-elses-key"])
def test_only_peers_with_a_valid_token_enter(server_peer, case):
    maddrs, run_id, key_text = server_peer
    result = subprocess.run(
        [sys.executable, "-c", ROGUE, json.dumps([maddrs, run_id, key_text, case])],
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    if case == "valid":
        assert outcome == {"case": "valid", "entered": True, "stored": True, "read": True}
    else:
        assert outcome["entered"] is False, outcome
