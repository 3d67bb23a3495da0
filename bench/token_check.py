"""What authenticating one DHT request costs, both ends together: hivemind's signed protocol against swarmhub's.

    .venv/bin/python bench/token_check.py [--requests 1000] [--repeats 5]

Every DHT request between two peers of a swarm is authenticated when it is sent, when it is served, when it is
answered and when the answer arrives. This times those four steps, side by side in one process on one thread, for:

- hivemind's token protocol with the token's signature verified at every check (``TokenAuthorizerBase`` as
  hivemind ships it): the client signs the request (RSA-2048), the server checks the token and the request's
  signature, clock and nonce, signs its answer, and the client checks the answer's token and signature;
- the same with each token verified once and then remembered (``VerifiedTokens``: swarmhub until protocol 2);
- swarmhub's protocol 2 (``worker/swarm/dht_auth.py``): each end checks that the token is valid (remembered) and binds
  the key of the libp2p connection the message came on; nothing is signed per request (the connection's TLS
  handshake proved the key once).

Prints the time per request (median of the repeats) and each variant's ratio to hivemind's. The request is a
``PingRequest``, the answer a ``PingResponse``; the libp2p transport's own cost (TLS, framing) is the same for all
three and not included. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import timedelta

from hivemind.p2p import PeerID
from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker.swarm import access as swarm_access

RUN = "bench-run"


class VerifiedEveryTime(swarm_access.SwarmAuthorizer):
    """hivemind's protocol as it ships: the token's signature checked on every call."""

    def is_token_valid(self, access_token) -> bool:  # noqa: ANN001
        return swarm_access.verify_token(access_token, self.experiment_key, self.run_id) and (
            access_token.username not in self.denied or access_token.public_key == self._local_public_key.to_bytes()
        )


async def signed(client: swarm_access.SwarmAuthorizer, server: swarm_access.SwarmAuthorizer, count: int) -> None:
    for _ in range(count):
        request = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo(), validate=False)
        await client.sign_request(request, None)
        assert await server.validate_request(request)
        response = dht_pb2.PingResponse()
        await server.sign_response(response, request)
        assert await client.validate_response(response, request)


async def bound(
    client: swarm_access.SwarmAuthorizer,
    server: swarm_access.SwarmAuthorizer,
    client_id: PeerID,
    server_id: PeerID,
    count: int,
) -> None:
    for _ in range(count):
        request = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo(), validate=False)
        await client.bind_request(request)
        assert await server.is_request_from(request, client_id)
        response = dht_pb2.PingResponse()
        await server.bind_response(response, request)
        assert client.is_answer_from(response, request, server_id)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    experiment = RSAPrivateKey()
    key = experiment.get_public_key()
    keys = {"client": RSAPrivateKey(), "server": RSAPrivateKey()}
    tokens = {
        name: swarm_access.to_access_token(
            swarm_access.sign_token(experiment, RUN, name, k.get_public_key().to_bytes(), timedelta(hours=1))
        )
        for name, k in keys.items()
    }
    ids = {
        name: PeerID.from_base58(swarm_access.peer_id_for_public_key(k.get_public_key().to_bytes()))
        for name, k in keys.items()
    }

    def pair(
        kind: type[swarm_access.SwarmAuthorizer],
    ) -> tuple[swarm_access.SwarmAuthorizer, swarm_access.SwarmAuthorizer]:
        def one(n: str) -> swarm_access.SwarmAuthorizer:
            return kind(keys[n], key, RUN, lambda: tokens[n], first_token=tokens[n])

        return one("client"), one("server")

    honest = swarm_access.SwarmAuthorizer
    every, remembered, connection = pair(VerifiedEveryTime), pair(honest), pair(honest)
    variants = {
        "hivemind's signed protocol": lambda n: signed(*every, n),
        "signed, tokens remembered": lambda n: signed(*remembered, n),
        "bound to the connection": lambda n: bound(*connection, ids["client"], ids["server"], n),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved: every variant sees the same machine
        for name, run in variants.items():
            started = time.perf_counter()
            asyncio.run(run(args.requests))
            times[name].append((time.perf_counter() - started) / args.requests)
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (run it with nothing else on the machine)")
    base = statistics.median(times["hivemind's signed protocol"])
    for name, values in times.items():
        median = statistics.median(values)
        print(
            f"{name:>27}: {median * 1e6:8.1f} us per request, both ends "
            f"({min(values) * 1e6:.1f}..{max(values) * 1e6:.1f}; {median / base:.3f}x)"
        )


if __name__ == "__main__":
    main()
