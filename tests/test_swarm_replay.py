"""Replay: a captured DHT request is served only on a connection of the peer whose token it carries.

A DHT request carries its sender's access token and no signature (``swarmhub.worker.swarm.dht_auth``): the serving peer
serves it when the token's key is the one the libp2p connection it came on was authenticated with. A refused call
gets no response (the servicer's wrapper returns None and the caller sees a handler error, which ``DHTProtocol``
treats as "no answer"). The rogue below is a real process on 127.0.0.1 that holds a captured request: it sends it
to the server's swarm peer as the honest peer (served), from another libp2p identity (refused: the copy is useless
to anyone without the honest peer's identity key), and as the honest peer again (served: the key's holder may ask
again; a copy gives it nothing it could not ask for itself).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from .swarm_processes import kill_all, make_join, tagged_env, tagged_processes, wait_gone

# Makes one rpc_ping as the honest peer would (its token), then sends those exact bytes: first as the honest peer,
# again from a fresh libp2p identity, again as the honest peer, and finally a fresh request to show the honest peer
# is still served after the replays.
REPLAY = """
import asyncio, json, sys
from pathlib import Path
from hivemind.p2p import P2P, P2PHandlerError, PeerID
from hivemind.proto import dht_pb2
from swarmhub.worker.swarm import access as swarm_access
from swarmhub.common.protocol import JoinResponse

join = JoinResponse.model_validate_json(sys.argv[1])
identity = Path(sys.argv[2])
key = swarm_access.load_or_create_identity(identity)
token = swarm_access.token_from_wire(join.swarm_token.model_dump())
experiment_key = swarm_access.public_key_from_text(join.experiment_public_key)
honest = swarm_access.SwarmAuthorizer(key, experiment_key, join.run_id, lambda: token, first_token=token)
server = PeerID.from_base58(join.initial_peers[0].rsplit("/p2p/", 1)[1])

async def signed_ping():
    request = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo())  # no node ID: the server's routing table is untouched
    await honest.bind_request(request)  # as DHTProtocol's client stub makes it
    return request.SerializeToString()

async def send(p2p, wire):
    request = dht_pb2.PingRequest.FromString(wire)
    assert request.SerializeToString() == wire  # what goes out is, byte for byte, the captured request
    try:
        response = await asyncio.wait_for(
            p2p.call_protobuf_handler(server, "DHTProtocol.rpc_ping", request, dht_pb2.PingResponse), timeout=10)
    except P2PHandlerError as exc:
        return {"answered": False, "error": type(exc).__name__, "message": str(exc)}
    valid = honest.is_answer_from(response, dht_pb2.PingRequest.FromString(wire), server)
    return {"answered": True, "node_id": bool(response.peer.node_id), "from_server": valid}

async def main():
    maddrs = ["/ip4/127.0.0.1/tcp/0"]
    as_honest = await P2P.create(join.initial_peers, host_maddrs=maddrs, identity_path=str(identity),
                                 check_if_identity_free=False)
    other = None
    try:
        wire = await signed_ping()
        first = await send(as_honest, wire)
        other = await P2P.create(join.initial_peers, host_maddrs=maddrs)
        replay_other = await send(other, wire)
        replay = await send(as_honest, wire)
        fresh = await send(as_honest, await signed_ping())
        distinct = other.peer_id != as_honest.peer_id and as_honest.peer_id.to_base58() == swarm_access.peer_id_of(
            identity)
        return {"first": first, "replay": replay, "replay_other_identity": replay_other, "fresh": fresh,
                "identities_distinct": distinct}
    finally:
        for p2p in (other, as_honest):
            if p2p is not None:
                await p2p.shutdown()

print(json.dumps(asyncio.run(main())), flush=True)
"""

SERVED = {"answered": True, "node_id": True, "from_server": True}


@pytest.mark.swarm
def test_a_captured_request_is_refused_from_any_other_peer(swarm_peer, tmp_path):
    tag = f"replay-{uuid.uuid4().hex}"
    identity = tmp_path / "honest.key"
    join = make_join(swarm_peer, worker_id="honest", identity=identity)  # an admitted peer's key and token
    try:
        done = subprocess.run(
            [sys.executable, "-c", REPLAY, join.model_dump_json(), str(identity)],
            capture_output=True,
            text=True,
            timeout=120,
            env=tagged_env(tag),
        )
        left = wait_gone(tag, timeout=10)
    finally:
        kill_all(tagged_processes(tag))
    assert done.returncode == 0, done.stderr[-2000:]
    assert not left, f"the rogue left processes behind: {[p.name() for p in left]}"
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["identities_distinct"] is True
    assert outcome["first"] == SERVED, outcome  # the setup works: the honest request is served, by the server's peer
    replay = outcome["replay_other_identity"]
    # refused: the servicer answered nothing (the wrapper returned None, which cannot be serialized)
    assert replay["answered"] is False and replay["error"] == "P2PHandlerError", outcome
    assert "'NoneType' object has no attribute 'SerializeToString'" in replay["message"], outcome
    assert outcome["replay"] == SERVED, outcome  # the key's holder sending it again: as good as a fresh request
    assert outcome["fresh"] == SERVED, outcome  # the refusal was the copy's, not the honest peer's
