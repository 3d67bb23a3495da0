"""The server process loads neither hivemind nor torch to sign swarm tokens (its swarm peers, which need them,
are subprocesses), and ``swarm_tokens`` reads and writes exactly what hivemind's key classes and peer IDs do."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hivemind.p2p.p2p_daemon_bindings.datastructures import PeerID
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.common import tokens as swarm_tokens
from swarmhub.server.core.db import make_engine, make_sessionmaker, migrate
from swarmhub.worker.swarm import access as swarm_access

from .conftest import PASSWORD, make_experiment, make_user

# A server process in its own interpreter (the test process has imported hivemind already): it starts, a
# volunteer logs in, joins the running experiment and refreshes its swarm token; it prints what got loaded.
SERVE = """
import json, sys, time
from pathlib import Path

from fastapi.testclient import TestClient

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.common import tokens as swarm_tokens

folder, swarm, create, password = Path(sys.argv[1]), sys.argv[2] == "on", sys.argv[3] == "create", sys.argv[4]
settings = Settings(
    environment="test", data_dir=folder / "data", database_url=f"sqlite:///{folder / 'hub.db'}", swarm_enabled=swarm
)
peer = {"peer_public_key": swarm_tokens.public_key_text(swarm_tokens.SigningKey.generate())}
with TestClient(create_app(settings)) as client:
    token = client.post("/api/auth/token", json={"username": "ada", "password": password}).json()["access_token"]
    headers = {"Authorization": f"Bearer {token}"}
    if create:
        made = client.post("/api/experiments", json={"slug": "digits-run", "title": "Digits"}, headers=headers)
        assert made.status_code == 201, made.text
        started = client.post("/api/experiments/digits-run/status", json={"action": "start"}, headers=headers)
        assert started.status_code == 200, started.text
    deadline = time.monotonic() + 120  # the swarm peer (a subprocess importing hivemind) may take a while
    while True:
        join = client.post("/api/experiments/digits-run/join", json=peer, headers=headers)
        if join.status_code != 503 or not swarm or time.monotonic() > deadline:
            break
        time.sleep(1)
    refresh = client.post("/api/experiments/digits-run/swarm-token", json=peer, headers=headers)
    loaded = sorted({name.split(".")[0] for name in sys.modules} & {"torch", "hivemind"})
print(json.dumps({"join": join.status_code, "peers": join.json().get("initial_peers"), "loaded": loaded,
                  "refresh": refresh.status_code, "signed_by": refresh.json().get("username")}))
"""


# The witness count the server reads from its monitor's progress events (``host.witnesses_wanted``), in a fresh
# interpreter: the serving process calls it whenever its monitor reports, which the test above may or may not see.
WITNESS_COUNT = """
import json, sys
from swarmhub.server.swarm import events, host, witnesses

contributors = [{"peer_id": f"Qm{name}", "username": name} for name in ("ada", "bob", "swarmhub")]
progress = events.Progress(epoch=3, peers=4, samples_per_second=1.0, samples=64, contributors=contributors)
wanted = witnesses.wanted(progress.volunteer_peers, 1)
print(json.dumps({"wanted": wanted, "loaded": sorted({n.split(".")[0] for n in sys.modules} & {"torch", "hivemind"})}))
"""


def test_counting_the_witnesses_a_swarm_needs_loads_neither_torch_nor_hivemind():
    """The monitor's progress events name each contributor; counting the volunteers' peers among them once read
    hivemind (through the worker's access module) in the serving process, as soon as a monitor reported."""
    done = subprocess.run([sys.executable, "-c", WITNESS_COUNT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"wanted": 2, "loaded": []}


def serve(folder: Path, swarm: str, create: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(folder), swarm, create, PASSWORD],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def hub_with_volunteer(folder: Path, running_experiment: bool) -> None:
    """The server's database as a restarted server finds it: user ``ada``, maybe a running experiment."""
    engine = make_engine(f"sqlite:///{folder / 'hub.db'}")
    migrate(engine)
    db = make_sessionmaker(engine)
    owner = make_user(db, "ada")
    if running_experiment:
        make_experiment(db, owner, slug="digits-run", status="running")
    engine.dispose()


@pytest.mark.parametrize("swarm", ["off", pytest.param("on", marks=pytest.mark.swarm)])
def test_serving_joins_loads_neither_torch_nor_hivemind(tmp_path: Path, swarm: str):
    hub_with_volunteer(tmp_path, running_experiment=True)
    result = serve(tmp_path, swarm, "existing")
    assert result["loaded"] == []
    # Without a swarm the join is refused after the token is signed; with one it returns the server's peer.
    assert result["join"] == (200 if swarm == "on" else 503)
    assert bool(result["peers"]) == (swarm == "on")
    assert (result["refresh"], result["signed_by"]) == (200, "ada")


def test_creating_an_experiment_loads_neither_torch_nor_hivemind(tmp_path: Path):
    """A new experiment gets a signing key without hivemind, and its task's parameters are validated without
    torch (the digits task imports torch where it builds and trains the model, on workers)."""
    hub_with_volunteer(tmp_path, running_experiment=False)
    result = serve(tmp_path, "off", "create")
    assert result["loaded"] == []
    assert (result["join"], result["refresh"], result["signed_by"]) == (503, 200, "ada")


# -- compatibility with hivemind's own keys, tokens and peer IDs -----------------------------------------------


def test_keys_and_signatures_match_hivemind():
    theirs = RSAPrivateKey()
    ours = swarm_tokens.signing_key_from_text(base64.b64encode(theirs.to_bytes()).decode())
    assert ours.to_bytes() == theirs.to_bytes()
    assert ours.get_public_key().to_bytes() == theirs.get_public_key().to_bytes()
    assert swarm_tokens.public_key_text(ours) == swarm_access.public_key_text(theirs)
    data = b"swarmhub-access-token/v1\nrun_id=r"
    assert theirs.get_public_key().verify(data, ours.sign(data))
    assert ours.get_public_key().verify(data, theirs.sign(data))
    assert not ours.get_public_key().verify(data + b"x", theirs.sign(data))
    assert not theirs.get_public_key().verify(data + b"x", ours.sign(data))
    # a key made for a new experiment loads in hivemind, as keys stored by earlier versions load here
    stored = swarm_tokens.new_signing_key_der()
    assert swarm_access.private_key_from_der(base64.b64decode(stored)).to_bytes() == base64.b64decode(stored)


def test_tokens_signed_without_hivemind_verify_with_hivemind_and_back(tmp_path: Path):
    run_id = "swarmhub-digits-run-1"
    experiment = RSAPrivateKey()
    server_side = swarm_tokens.signing_key_from_text(base64.b64encode(experiment.to_bytes()).decode())
    peer = swarm_access.load_or_create_identity(tmp_path / "peer.key").get_public_key().to_bytes()
    token = swarm_tokens.sign_token(server_side, run_id, "ada", peer, swarm_tokens.REFRESH_MARGIN)
    payload = swarm_tokens.token_payload(run_id, "ada", peer, token.expiration_time)
    assert experiment.get_public_key().verify(payload, token.signature)
    # what a worker receives: the wire form, read back into hivemind's AccessToken
    received = swarm_access.token_from_wire(json.loads(json.dumps(swarm_tokens.token_to_wire(token))))
    assert swarm_access.verify_token(received, experiment.get_public_key(), run_id)
    minted_by_peer = swarm_access.sign_token(experiment, run_id, "ada", peer, swarm_tokens.REFRESH_MARGIN)
    assert swarm_tokens.verify_token(minted_by_peer, server_side.get_public_key(), run_id)
    assert not swarm_tokens.verify_token(minted_by_peer, server_side.get_public_key(), run_id + "-other")


def test_peer_id_matches_hivemind(tmp_path: Path):
    for name in ("a.key", "b.key"):
        identity = swarm_access.load_or_create_identity(tmp_path / name)
        hivemind_id = PeerID.from_identity((tmp_path / name).read_bytes()).to_base58()
        assert swarm_tokens.peer_id_for_public_key(identity.get_public_key().to_bytes()) == hivemind_id
