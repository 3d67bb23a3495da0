"""Swarm access: token bytes and checks, and rogue peers (real processes on 127.0.0.1) that a swarm refuses."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker.swarm import access as swarm_access

from .swarm_processes import LineReader, kill_all, make_join, tagged_env, wait_gone

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


class CountingKey:
    """The experiment's real public key, counting the signatures it checks."""

    def __init__(self, key):
        self.key, self.calls = key, 0

    def verify(self, data: bytes, signature: bytes) -> bool:
        self.calls += 1
        return self.key.verify(data, signature)


def test_a_token_is_verified_once_and_then_checked_at_the_cost_of_a_lookup():
    experiment = RSAPrivateKey()
    key = CountingKey(experiment.get_public_key())
    peer = RSAPrivateKey()
    good = swarm_access.sign_token(experiment, RUN, "ada", peer.get_public_key().to_bytes(), timedelta(minutes=5))
    denied = {"mallory"}
    authorizer = swarm_access.SwarmAuthorizer(
        RSAPrivateKey(), key, RUN, fetch=lambda: good, denied=swarm_access.DenyList(lambda: set(denied), 3600)
    )
    wire = swarm_access.to_access_token(good)
    assert all(authorizer.is_token_valid(wire) for _ in range(1000))
    assert key.calls == 1  # one signature check for a thousand requests
    # a token that differs in any field is checked on its own and refused
    for field, value in (("username", "grace"), ("expiration_time", "2099-01-01T00:00:00Z")):
        forged = swarm_access.to_access_token(
            swarm_access.token_from_wire({**swarm_access.token_to_wire(good), field: value})
        )
        assert not authorizer.is_token_valid(forged) and not authorizer.is_token_valid(forged)
    assert key.calls == 5  # a refused token is never remembered: each try costs its own check
    # a removed volunteer's remembered token stops working at once (the deny list is read on every check)
    mallory = swarm_access.to_access_token(
        swarm_access.sign_token(
            experiment, RUN, "mallory", RSAPrivateKey().get_public_key().to_bytes(), timedelta(minutes=5)
        )
    )
    assert not authorizer.is_token_valid(mallory)
    denied.clear()
    authorizer.denied = swarm_access.DenyList(lambda: set(denied), 3600)
    assert authorizer.is_token_valid(mallory)
    denied.add("mallory")
    authorizer.denied = swarm_access.DenyList(lambda: set(denied), 3600)
    assert not authorizer.is_token_valid(mallory)


def test_a_request_counts_only_on_the_connection_of_the_key_its_token_binds():
    """The check behind every DHT request and answer (``dht_auth``): the token valid, its user not removed, its key
    the one whose peer ID the connection was authenticated as; an answer must also echo the request's nonce."""
    experiment, ada, bob = RSAPrivateKey(), RSAPrivateKey(), RSAPrivateKey()

    def token(key: RSAPrivateKey, username: str, lifetime: timedelta = timedelta(minutes=5)):
        public = key.get_public_key().to_bytes()
        return swarm_access.to_access_token(swarm_access.sign_token(experiment, RUN, username, public, lifetime))

    def peer_id(key: RSAPrivateKey) -> PeerID:
        return PeerID.from_base58(swarm_access.peer_id_for_public_key(key.get_public_key().to_bytes()))

    ada_token, bob_token = token(ada, "ada"), token(bob, "bob")
    denied: set[str] = set()
    ada_side = swarm_access.SwarmAuthorizer(ada, experiment.get_public_key(), RUN, lambda: ada_token, ada_token)
    bob_side = swarm_access.SwarmAuthorizer(
        bob,
        experiment.get_public_key(),
        RUN,
        lambda: bob_token,
        bob_token,
        denied=swarm_access.DenyList(lambda: denied, 3600),
    )
    request = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo())
    asyncio.run(ada_side.bind_request(request))
    assert request.auth.signature == b""  # nothing is signed per request
    assert asyncio.run(bob_side.is_request_from(request, peer_id(ada)))
    assert not asyncio.run(bob_side.is_request_from(request, peer_id(RSAPrivateKey())))  # on another connection
    response = dht_pb2.PingResponse()
    asyncio.run(bob_side.bind_response(response, request))
    assert ada_side.is_answer_from(response, request, peer_id(bob))
    assert not ada_side.is_answer_from(response, request, peer_id(RSAPrivateKey()))  # another peer was dialed
    other = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo())
    asyncio.run(ada_side.bind_request(other))
    assert not ada_side.is_answer_from(response, other, peer_id(bob))  # the answer to another request
    for bad in (token(ada, "ada", timedelta(seconds=-30)), token(RSAPrivateKey(), "ada")):  # expired; another key's
        forged = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo())
        forged.auth.client_access_token.CopyFrom(bad)
        assert not asyncio.run(bob_side.is_request_from(forged, peer_id(ada)))
    garbled = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo())
    garbled.auth.client_access_token.CopyFrom(ada_token)
    garbled.auth.client_access_token.public_key = b"not a key"
    assert not asyncio.run(bob_side.is_request_from(garbled, peer_id(ada)))
    denied.add("ada")  # removed: her valid token on her own connection is refused from the next request on
    bob_side.denied = swarm_access.DenyList(lambda: denied, 3600)
    assert not asyncio.run(bob_side.is_request_from(request, peer_id(ada)))


def test_a_remembered_token_stops_working_when_it_expires():
    experiment = RSAPrivateKey()
    peer = RSAPrivateKey().get_public_key().to_bytes()
    short = swarm_access.sign_token(experiment, RUN, "ada", peer, timedelta(seconds=2))
    verified = swarm_access.VerifiedTokens(experiment.get_public_key(), RUN, limit=2)
    assert verified.valid(short)
    time.sleep(2.1)
    assert not verified.valid(short)
    # at most ``limit`` tokens are remembered, the oldest forgotten first
    key = CountingKey(experiment.get_public_key())
    verified = swarm_access.VerifiedTokens(key, RUN, limit=2)
    tokens = [swarm_access.sign_token(experiment, RUN, n, peer, timedelta(minutes=5)) for n in ("a", "b", "c")]
    for token in tokens:
        assert verified.valid(token)
    assert verified.valid(tokens[2]) and verified.valid(tokens[1]) and key.calls == 3
    assert verified.valid(tokens[0]) and key.calls == 4  # forgotten, checked again


def test_identity_key_is_stable_and_private(tmp_path):
    path = tmp_path / "ids" / "run.key"
    first = swarm_access.load_or_create_identity(path)
    again = swarm_access.load_or_create_identity(path)
    assert first.get_public_key().to_bytes() == again.get_public_key().to_bytes()
    assert path.stat().st_mode & 0o777 == 0o400
    assert swarm_access.peer_id_of(path)  # hivemind derives the peer ID from the same key


# Peers that try to enter the swarm, one after the other in one process, with the tokens the test names; the
# authorizer is a rogue one that does not check its own token (an honest one refuses to send a bad token at all).
ROGUE = """
import json, os, sys, tempfile
from datetime import timedelta
import hivemind
from hivemind.proto import crypto_pb2
from hivemind.utils.timed_storage import get_dht_time
from hivemind.utils.crypto import RSAPrivateKey
from swarmhub.worker.swarm import access as swarm_access

maddrs, run_id, signing_text, cases = json.loads(sys.argv[1])
signing = swarm_access.signing_key_from_text(signing_text)

class Rogue(swarm_access.SwarmAuthorizer):
    def is_token_valid(self, token):
        return True

for case in cases:
    me = RSAPrivateKey()
    pk = me.get_public_key().to_bytes()
    # Its libp2p identity is the key it holds, as a worker's; but "one-token-many-peers" runs a second peer ID on
    # the valid token of its first (one volunteer's token spread over many peers).
    runs_as = RSAPrivateKey() if case == "one-token-many-peers" else me
    identity = os.path.join(tempfile.mkdtemp(), "id.key")
    with open(identity, "wb") as out:
        out.write(crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=runs_as.to_bytes()).SerializeToString())
    tokens = {
        "valid": lambda: swarm_access.sign_token(signing, run_id, "ada", pk, timedelta(minutes=5)),
        "one-token-many-peers": lambda: swarm_access.sign_token(signing, run_id, "ada", pk, timedelta(minutes=5)),
        "other-key": lambda: swarm_access.sign_token(RSAPrivateKey(), run_id, "ada", pk, timedelta(minutes=5)),
        "expired": lambda: swarm_access.sign_token(signing, run_id, "ada", pk, timedelta(seconds=-30)),
        "other-experiment": lambda: swarm_access.sign_token(signing, run_id + "-x", "ada", pk, timedelta(minutes=5)),
        "someone-elses-key": lambda: swarm_access.sign_token(
            signing, run_id, "ada", RSAPrivateKey().get_public_key().to_bytes(), timedelta(minutes=5)),
    }
    authorizer = None
    if case != "no-token":
        authorizer = Rogue(me, signing.get_public_key(), run_id, tokens[case])
    try:
        dht = hivemind.DHT(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                           identity_path=identity, start=True)
    except Exception as exc:
        print(json.dumps({"case": case, "entered": False, "error": type(exc).__name__}), flush=True)
        continue
    stored = dht.store(f"{run_id}_rogue", "hello", get_dht_time() + 30)
    seen = dht.get(f"{run_id}_rogue", latest=True)
    print(json.dumps({"case": case, "entered": True, "stored": bool(stored), "read": seen is not None}), flush=True)
    dht.shutdown()
"""

ROGUE_CASES = ["no-token", "other-key", "expired", "other-experiment", "someone-elses-key", "one-token-many-peers"]


def try_to_enter(maddrs: list[str], run_id: str, key_text: str, cases: list[str]) -> dict[str, dict]:
    args = json.dumps([maddrs, run_id, key_text, cases])
    done = subprocess.run([sys.executable, "-c", ROGUE, args], capture_output=True, text=True, timeout=180)
    outcomes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {outcome.pop("case"): outcome for outcome in outcomes}


# An honest trainer: says where it listens, then trains until it is told to stop, and prints each averaging
# round it completes with the number of peers in it.
HONEST = """
import json, logging, os, re, signal, sys, threading
from pathlib import Path
from swarmhub.common.protocol import JoinResponse
from swarmhub.worker.training.peer import OPTIMIZER_LOGGER, train

join = JoinResponse.model_validate_json(sys.argv[1])
deny_file = Path(sys.argv[3])
stop = threading.Event()
main_pid = os.getpid()

def on_term(signum, frame):  # leave the swarm cleanly; hivemind's forked children must still die on SIGTERM
    if os.getpid() == main_pid:
        stop.set()
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

class Rounds(logging.Handler):  # hivemind's status line, the one train() counts rounds from
    def emit(self, record):
        if match := re.search(r"Averaged gradients with (\\d+) peers", record.getMessage()):
            print(json.dumps({"averaged": int(match.group(1))}), flush=True)

logging.getLogger(OPTIMIZER_LOGGER).addHandler(Rounds())
signal.signal(signal.SIGTERM, on_term)
train(
    join, device="cpu", listen_maddrs=["/ip4/127.0.0.1/tcp/0"], max_minutes=5, identity_path=Path(sys.argv[2]),
    denied=lambda: set(deny_file.read_text().split()) if deny_file.exists() else set(),
    on_joined=lambda peer_id, maddrs: print(json.dumps({"peer_id": peer_id, "maddrs": maddrs}), flush=True),
    stop_event=stop,
)
"""

# Calls an honest peer's averagers directly, by address, as a peer that learned it would: state download, a
# request to join a group, and a part of a vector to aggregate.
DIRECT = """
import asyncio, json, sys
from datetime import timedelta
import hivemind
from hivemind.optim.grad_averager import GradientAverager
from hivemind.optim.state_averager import TrainingStateAverager
from hivemind.p2p import P2P, PeerID
from hivemind.utils.asyncio import as_aiter
from hivemind.utils.timed_storage import get_dht_time
from hivemind.proto import averaging_pb2, runtime_pb2
from hivemind.utils.crypto import RSAPrivateKey
from swarmhub.worker.swarm import access as swarm_access

maddrs, peer_id, bootstrap, run_id, signing_text, admitted = json.loads(sys.argv[1])
signing = swarm_access.signing_key_from_text(signing_text)

async def count(replies):
    received = 0
    try:
        async for _ in await replies:
            received += 1
    except Exception:
        pass
    return received

async def call(p2p):
    target = PeerID.from_base58(peer_id)
    state = TrainingStateAverager.get_stub(p2p, target, namespace=f"{run_id}_state_averager")
    parts = await count(state.rpc_download_state(averaging_pb2.DownloadRequest()))
    grads = GradientAverager.get_stub(p2p, target, namespace=f"{run_id}_grad_averager")
    request = averaging_pb2.JoinRequest(schema_hash=b"x", expiration=get_dht_time() + 5)
    replies = await count(grads.rpc_join_group(request))
    # Not a group this caller is in: a peer on the roster is told so (BAD_GROUP_ID), a rogue hears nothing.
    part = averaging_pb2.AveragingData(code=averaging_pb2.PART_FOR_AVERAGING, group_id=b"rogue-group",
                                       tensor_part=runtime_pb2.Tensor(), weight=1.0)
    aggregated = await asyncio.wait_for(count(grads.rpc_aggregate_part(as_aiter(part))), 30)
    return {"parts": parts, "replies": replies, "aggregated": aggregated}

if admitted:  # a peer with a valid token, on the roster: the positive control
    key = RSAPrivateKey()
    swarm_access.use_as_process_key(key)
    token = swarm_access.sign_token(signing, run_id, "ada", key.get_public_key().to_bytes(), timedelta(minutes=5))
    authorizer = swarm_access.SwarmAuthorizer(key, signing.get_public_key(), run_id, lambda: token, first_token=token)
    import tempfile, os
    identity = os.path.join(tempfile.mkdtemp(), "id.key")
    from hivemind.proto import crypto_pb2
    blob = crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString()
    open(identity, "wb").write(blob)
    dht = hivemind.DHT(initial_peers=bootstrap + maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                       identity_path=identity, start=True)
    swarm_access.add_roster_validators(dht, run_id, key)
    assert swarm_access.publish_roster_entry(dht, run_id, token)
    p2p = asyncio.run(dht.replicate_p2p())
    print(json.dumps(asyncio.run(call(p2p))), flush=True)
    for _ in sys.stdin:  # the same peer, admitted and answered before, asks again (after a removal, say)
        print(json.dumps(asyncio.run(call(p2p))), flush=True)
    dht.shutdown()
else:  # no token, never in the DHT: straight to the averagers
    async def rogue():
        p2p = await P2P.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        try:
            return await call(p2p)
        finally:
            await p2p.shutdown()
    print(json.dumps(asyncio.run(rogue())), flush=True)
"""


@pytest.mark.swarm
def test_rogues_get_nothing_while_two_honest_peers_average(swarm_peer, tmp_path):
    """While two honest peers train and average, rogue peers try the DHT (through the server's peer and both
    trainers) and the averagers directly; they get nothing, and the honest peers go on averaging together."""
    maddrs, run_id, key_text = swarm_peer.maddrs, swarm_peer.run_id, swarm_peer.key_text
    deny_file = tmp_path / "denied"
    tag = f"honest-{uuid.uuid4().hex}"
    honest: dict[str, subprocess.Popen[str]] = {}
    lines: dict[str, LineReader] = {}
    callers: list[subprocess.Popen[str]] = []

    def wait_for(name: str, wanted: dict | str, timeout: float) -> dict:
        """The next JSON line of trainer ``name`` that has key ``wanted`` (or holds the items of ``wanted``)."""
        deadline = time.monotonic() + timeout
        while (line := lines[name].next(max(deadline - time.monotonic(), 0.01))) is not None:
            event = json.loads(line) if line.startswith("{") else {}
            if (wanted in event) if isinstance(wanted, str) else wanted.items() <= event.items():
                return event
        raise AssertionError(f"trainer {name} printed no {wanted} within {timeout} s")

    try:
        for name in ("a", "b"):
            identity = tmp_path / f"{name}.key"
            join = make_join(swarm_peer, worker_id=f"honest-{name}", identity=identity)
            honest[name] = subprocess.Popen(
                [sys.executable, "-c", HONEST, join.model_dump_json(), str(identity), str(deny_file)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                env=tagged_env(tag),
            )
            lines[name] = LineReader(honest[name])
        where = {name: wait_for(name, "peer_id", 90) for name in honest}
        for name in honest:
            wait_for(name, {"averaged": 2}, 120)  # the two average together

        everyone = maddrs + where["a"]["maddrs"] + where["b"]["maddrs"]
        entered = try_to_enter(everyone, run_id, key_text, [*ROGUE_CASES, "valid"])

        def direct(admitted: bool) -> tuple[subprocess.Popen[str], LineReader, dict]:
            args = json.dumps([where["a"]["maddrs"], where["a"]["peer_id"], maddrs, run_id, key_text, admitted])
            caller = subprocess.Popen(
                [sys.executable, "-c", DIRECT, args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            callers.append(caller)
            reader = LineReader(caller)
            return caller, reader, read_result(reader)

        def read_result(reader: LineReader) -> dict:
            while (line := reader.next(120)) is not None:
                if line.startswith("{"):
                    return json.loads(line)
            raise AssertionError("the direct caller ended without a result")

        rogue_caller, _, rogue = direct(False)
        assert rogue_caller.wait(30) == 0
        # The positive control: a peer on the roster, answered; it stays connected for the removal below.
        admitted_caller, admitted_lines, admitted = direct(True)
        # The organizer removes "ada": within the stated bound the honest peer serves her nothing more, though
        # her peer was admitted a moment ago and still holds a validly signed token.
        deny_file.write_text("ada\n")
        time.sleep(swarm_access.DENY_POLL_SECONDS + 2)
        assert admitted_caller.stdin is not None
        admitted_caller.stdin.write("again\n")
        admitted_caller.stdin.flush()
        removed = read_result(admitted_lines)
        admitted_caller.stdin.close()
        assert admitted_caller.wait(60) == 0
        for name in honest:  # after all that, the honest peers still complete rounds together
            wait_for(name, {"averaged": 2}, 90)
    finally:
        for proc in [*honest.values(), *callers]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*honest.values(), *callers]:
            proc.wait(90)
    left = wait_gone(tag, 20)
    kill_all(left)
    assert not left, "the honest peers left processes behind"
    assert entered == {
        **{case: {"entered": False, "error": entered[case].get("error")} for case in ROGUE_CASES},
        "valid": {"entered": True, "stored": True, "read": True},  # the control: the same script gets in
    }, entered
    nothing = {"parts": 0, "replies": 0, "aggregated": 0}
    assert rogue == nothing  # the rogue got neither the model, nor a group, nor an answer to its part
    assert admitted["parts"] > 0 and admitted["aggregated"] == 1  # a peer on the roster is answered
    assert removed == nothing


# A swarm of two: a hostile first peer that answers each DHT request with the token of the test's choice, and an
# honest peer that joins through it. Per case: whether the honest peer got in and read what the hostile one stored.
ANSWERER = """
import json, os, sys, tempfile
from datetime import timedelta
import hivemind
from hivemind.proto import crypto_pb2
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time
from swarmhub.worker.swarm import access as swarm_access

run_id = "swarmhub-answers-1"
signing = swarm_access.SigningKey.generate()

def peer(username, authorizer_class=swarm_access.SwarmAuthorizer):
    key = RSAPrivateKey()
    identity = os.path.join(tempfile.mkdtemp(), "id.key")
    with open(identity, "wb") as out:
        out.write(crypto_pb2.PrivateKey(key_type=crypto_pb2.KeyType.RSA, data=key.to_bytes()).SerializeToString())
    token = swarm_access.sign_token(signing, run_id, username, key.get_public_key().to_bytes(), timedelta(minutes=5))
    authorizer = authorizer_class(key, signing.get_public_key(), run_id, lambda: token, first_token=token)
    return authorizer, identity, token

class Answerer(swarm_access.SwarmAuthorizer):  # answers with the token in ``answer_with``, not always its own
    answer_with = None
    async def bind_response(self, response, request):
        await super().bind_response(response, request)
        if self.answer_with is not None:
            response.auth.service_access_token.CopyFrom(self.answer_with)

_, _, bobs = peer("bob")  # a volunteer in good standing, whose valid token the hostile peer copied
for case in json.loads(sys.argv[1]):
    hostile, identity, own = peer("mallory", Answerer)
    hostile.answer_with = {"own-token": None, "bobs-token": bobs}[case]
    first = hivemind.DHT(host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=hostile, identity_path=identity, start=True)
    first.store(f"{run_id}_note", "from the first peer", get_dht_time() + 60)
    honest, identity, _ = peer("ada")
    try:
        second = hivemind.DHT(initial_peers=[str(a) for a in first.get_visible_maddrs()], authorizer=honest,
                              host_maddrs=["/ip4/127.0.0.1/tcp/0"], identity_path=identity, start=True)
    except Exception:
        print(json.dumps({"case": case, "entered": False}), flush=True)
    else:
        print(json.dumps({"case": case, "entered": True, "read": second.get(f"{run_id}_note") is not None}), flush=True)
        second.shutdown()
    first.shutdown()
"""


@pytest.mark.swarm
def test_an_answer_counts_only_from_the_peer_its_token_binds():
    """A peer that answers DHT requests with another volunteer's valid token (copied from a request, say: a removed
    volunteer's peer posing as one in good standing) is not heard: a joining peer gets no answer from it. The same
    peer answering with its own token is (the control)."""
    done = subprocess.run(
        [sys.executable, "-c", ANSWERER, json.dumps(["bobs-token", "own-token"])],
        capture_output=True,
        text=True,
        timeout=180,
    )
    outcomes = {
        o.pop("case"): o for o in map(json.loads, filter(lambda x: x.startswith("{"), done.stdout.splitlines()))
    }
    assert outcomes == {"bobs-token": {"entered": False}, "own-token": {"entered": True, "read": True}}, done.stderr[
        -3000:
    ]


@pytest.mark.swarm
def test_removed_volunteer_cannot_enter_the_dht(swarm_peer):
    """The server's own peer reads the deny-list the server keeps beside its key, and refuses the user."""
    maddrs, run_id, key_text = swarm_peer.maddrs, swarm_peer.run_id, swarm_peer.key_text
    swarm_peer.deny_file.write_text("ada\n")
    time.sleep(swarm_access.DENY_POLL_SECONDS + 1)
    assert try_to_enter(maddrs, run_id, key_text, ["valid"])["valid"]["entered"] is False


# An admitted peer that publishes its roster entry the way workers do, then follows the test's commands on stdin:
# "forge VICTIM_KEY" tries to take the victim's entry over, "read" prints the roster as this peer's averagers see it.
ROSTER_PEER = """
import json, os, sys, tempfile
from datetime import timedelta
from pathlib import Path
import hivemind
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import get_dht_time
from swarmhub.worker.swarm import access as swarm_access

maddrs, run_id, signing_text, username = json.loads(sys.argv[1])
signing = swarm_access.signing_key_from_text(signing_text)
identity = Path(tempfile.mkdtemp()) / "id.key"
key = swarm_access.load_or_create_identity(identity)
swarm_access.use_as_process_key(key)
public_key = key.get_public_key().to_bytes()
token = swarm_access.sign_token(signing, run_id, username, public_key, timedelta(minutes=5))
authorizer = swarm_access.SwarmAuthorizer(key, signing.get_public_key(), run_id, lambda: token, first_token=token)
dht = hivemind.DHT(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], authorizer=authorizer,
                   identity_path=str(identity), start=True)
swarm_access.add_roster_validators(dht, run_id, key)
print(json.dumps({"peer_id": dht.peer_id.to_base58(), "public_key": public_key.decode(),
                  "published": swarm_access.publish_roster_entry(dht, run_id, token)}), flush=True)
roster = swarm_access.roster_key(run_id)
for line in sys.stdin:
    command, *args = line.split(maxsplit=1)
    if command == "read":
        guard = swarm_access.RosterGuard(signing.get_public_key(), run_id)
        admitted = guard.admit(dht.get(roster, latest=True))
        print(json.dumps({peer: [guard.username_of(peer), expiry] for peer, expiry in admitted.items()}), flush=True)
    elif command == "forge":
        victim = args[0].strip().encode()
        # a later expiry replaces a subkey's value (each attempt's is later still), on any peer that accepts it
        later = get_dht_time() + 3600
        mine = swarm_access.token_to_wire(token)
        # a valid token for the victim's key, with a later expiry than the victim's own
        victims = swarm_access.sign_token(signing, run_id, "victim", victim, timedelta(minutes=50))
        ghost = RSAPrivateKey().get_public_key().to_bytes()  # a key that never joined
        attempts = {
            # this peer's own token (the bogus later-expiring entry of the audit) under the victim's subkey
            "own-token-in-victims-entry": dht.store(roster, mine, later + 1, subkey=swarm_access.roster_subkey(victim)),
            # the victim's entry rewritten, with a token the server would sign but not with the victim's key
            "victims-entry-rewritten": dht.store(
                roster, swarm_access.token_to_wire(victims), later + 2, subkey=swarm_access.roster_subkey(victim)),
            # the whole roster replaced by a plain value that expires later than every entry
            "roster-replaced": dht.store(roster, "gone", later + 3),
            # a valid token of another key, under this peer's own (signed) subkey
            "ghost-token-as-mine": dht.store(
                roster,
                swarm_access.token_to_wire(swarm_access.sign_token(signing, run_id, "ghost", ghost,
                                                                   timedelta(minutes=5))),
                later + 4,
                subkey=swarm_access.roster_subkey(public_key),
            ),
        }
        print(json.dumps({"attempts": attempts, "ghost": swarm_access.peer_id_for_public_key(ghost)}), flush=True)
dht.shutdown()
"""


@pytest.mark.swarm
def test_an_admitted_peer_cannot_overwrite_another_peers_roster_entry(swarm_peer):
    """Roster entries are signed by the key their token binds: an admitted peer cannot replace another's entry
    (nor the whole roster), and a token published under someone else's key admits no one."""
    run = [swarm_peer.maddrs, swarm_peer.run_id, swarm_peer.key_text]
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name in ("victim", "mallory"):
            procs[name] = subprocess.Popen(
                [sys.executable, "-c", ROSTER_PEER, json.dumps([*run, name])],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        peers = {name: json.loads(proc.stdout.readline()) for name, proc in procs.items()}

        def ask(name: str, command: str) -> dict:
            procs[name].stdin.write(command + "\n")
            procs[name].stdin.flush()
            return json.loads(procs[name].stdout.readline())

        assert peers["victim"]["published"] and peers["mallory"]["published"], peers
        before = ask("victim", "read")
        victim_id, mallory_id = peers["victim"]["peer_id"], peers["mallory"]["peer_id"]
        assert before.keys() == {victim_id, mallory_id}, before

        forged = ask("mallory", "forge " + peers["victim"]["public_key"])
        assert forged["attempts"] == {
            "own-token-in-victims-entry": False,
            "victims-entry-rewritten": False,
            "roster-replaced": False,
            "ghost-token-as-mine": True,  # its own entry is its to write; readers still admit no ghost
        }, forged
        for reader in ("victim", "mallory"):
            after = ask(reader, "read")
            assert after[victim_id] == before[victim_id] == ["victim", before[victim_id][1]], (reader, after)
            assert forged["ghost"] not in after
            assert mallory_id not in after  # it overwrote its own entry with the ghost's token
    finally:
        for proc in procs.values():
            proc.stdin.close()
        for proc in procs.values():
            try:
                assert proc.wait(30) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
