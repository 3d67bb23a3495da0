"""DHT requests authenticated by the connection they travel on, not by a signature each.

hivemind's token protocol (``TokenAuthorizerBase``) signs every DHT request and every answer with the sender's
RSA-2048 key and verifies both ends: two RSA signatures a request (0.26 ms each on a fast 2-core machine, 1.25 ms
on a slow one), and a swarm's peers send several requests a second to each other (lookups, progress records, the
roster). Measured in ``bench/worker_overhead.py``, that was about a tenth of the CPU of a worker's helper processes
and of the server's monitor peer (docs/benchmarks/worker-overhead.md).

The signature proves that the sender holds the key its access token binds. libp2p already proves the same thing
once per connection: every stream between two peers runs over a TLS 1.3 channel whose handshake is signed by each
peer's identity key, and the peer ID that the local daemon reports for the other end is the hash of that key
(hivemind's ``P2PContext.remote_id`` for a request received, the dialed peer ID for an answer). swarmhub peers
always run with their identity key as the libp2p identity (``identity_path``), and the token binds that key. So:

- a request is served when its token is valid (checked once, then a lookup: ``VerifiedTokens``), its user is not
  removed, and the key the token binds hashes to the peer ID of the connection it came on;
- an answer is accepted when the same holds for the peer that was dialed.

A token copied from another peer is useless: the copier's connection carries its own peer ID. A replayed request
cannot enter another peer's connection (the channel is authenticated and encrypted end to end, relayed or not).
Nothing is signed per request; what is left per request is a dictionary lookup.

``install()`` makes every ``hivemind.DHT`` created afterwards, in this process and the processes it forks (the DHT
runs in one), use this wrapper for a ``SwarmAuthorizer``; any other authorizer keeps hivemind's own protocol.
Every peer of a swarm speaks the same: ``protocol.SWARM_PROTOCOL`` names the version, and the server refuses a
join from a worker that speaks an earlier one.
"""

from __future__ import annotations

import functools
from typing import Any

import hivemind.dht.protocol
from hivemind.p2p import PeerID
from hivemind.utils.auth import AuthRole, AuthRPCWrapper

from swarmhub.common.tokens import peer_id_for_public_key

PEER_ID_CACHE = 4096  # public keys whose peer ID is remembered (one per peer met; forgotten all at once when full)


class PeerIds:
    """The libp2p peer ID (bytes) of a token's public key, computed once per key."""

    def __init__(self, limit: int = PEER_ID_CACHE):
        self.limit = limit
        self._known: dict[bytes, bytes | None] = {}

    def of(self, public_key: bytes) -> bytes | None:
        if public_key in self._known:
            return self._known[public_key]
        try:
            peer_id: bytes | None = PeerID.from_base58(peer_id_for_public_key(public_key)).to_bytes()
        except Exception:  # noqa: BLE001 - anything a caller sends that does not parse as an RSA key binds no peer
            peer_id = None
        if len(self._known) >= self.limit:
            self._known.clear()
        self._known[public_key] = peer_id
        return peer_id


class PeerBoundRPCWrapper(AuthRPCWrapper):
    """hivemind's ``AuthRPCWrapper`` (the DHT's requests and handlers) with the checks above for a
    ``SwarmAuthorizer``; hivemind's signed protocol for any other authorizer."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("rpc_"):
            return object.__getattribute__(self, name)
        authorizer = object.__getattribute__(self, "_authorizer")
        if not hasattr(authorizer, "bind_request"):
            return AuthRPCWrapper.__getattribute__(self, name)
        stub = object.__getattribute__(self, "_stub")
        method = getattr(stub, name)
        if object.__getattribute__(self, "_role") == AuthRole.CLIENT:
            dialed: PeerID = stub._peer  # the peer this stub's requests go to (libp2p checks the dialed ID)

            @functools.wraps(method)
            async def ask(request: Any, *args: Any, **kwargs: Any) -> Any:
                await authorizer.bind_request(request)
                response = await method(request, *args, **kwargs)
                return response if authorizer.is_answer_from(response, request, dialed) else None

            return ask

        @functools.wraps(method)
        async def serve(request: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
            if not await authorizer.is_request_from(request, context.remote_id):
                return None
            response = await method(request, context, *args, **kwargs)
            await authorizer.bind_response(response, request)
            return response

        return serve


def install() -> None:
    """Use ``PeerBoundRPCWrapper`` in every DHT created from now on (idempotent)."""
    hivemind.dht.protocol.AuthRPCWrapper = PeerBoundRPCWrapper  # type: ignore[misc]
