"""What checking a peer's access token costs on every hivemind request: verified each time, and remembered.

    .venv/bin/python bench/token_check.py [--requests 2000] [--repeats 5]

hivemind's authorizer checks the caller's token on every DHT request and response (``validate_request``,
``validate_response``), and swarmhub's averaging guard checks the roster's tokens at each read. This times, side
by side in one process on one thread, a full ``validate_request`` of a signed DHT request (the token check plus
the request's own signature, its clock and its nonce) with the token's signature verified every time, as before,
and with ``VerifiedTokens`` remembering it. Prints the time per request (median of the repeats) and the ratio.
Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from datetime import timedelta

from hivemind.proto import dht_pb2
from hivemind.utils.crypto import RSAPrivateKey

from swarmhub.worker import swarm_access

RUN = "bench-run"


class VerifiedEveryTime(swarm_access.SwarmAuthorizer):
    """The authorizer as it was: the token's signature checked on every call."""

    def is_token_valid(self, access_token) -> bool:  # noqa: ANN001
        return swarm_access.verify_token(access_token, self.experiment_key, self.run_id) and (
            access_token.username not in self.denied or access_token.public_key == self._local_public_key.to_bytes()
        )


def requests(client: swarm_access.SwarmAuthorizer, count: int) -> list[dht_pb2.PingRequest]:
    async def sign() -> list[dht_pb2.PingRequest]:
        signed = []
        for _ in range(count):
            request = dht_pb2.PingRequest(peer=dht_pb2.NodeInfo(), validate=False)
            await client.sign_request(request, None)
            signed.append(request)
        return signed

    return asyncio.run(sign())


def per_request(server: swarm_access.SwarmAuthorizer, signed: list[dht_pb2.PingRequest]) -> float:
    async def validate() -> None:
        for request in signed:
            copy = dht_pb2.PingRequest()
            copy.CopyFrom(request)
            assert await server.validate_request(copy)

    started = time.perf_counter()
    asyncio.run(validate())
    return (time.perf_counter() - started) / len(signed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    experiment = RSAPrivateKey()
    key = experiment.get_public_key()
    client_key, server_key = RSAPrivateKey(), RSAPrivateKey()
    token = swarm_access.sign_token(experiment, RUN, "ada", client_key.get_public_key().to_bytes(), timedelta(hours=1))
    server_token = swarm_access.sign_token(
        experiment, RUN, "srv", server_key.get_public_key().to_bytes(), timedelta(hours=1)
    )
    access = swarm_access.to_access_token(token)
    client = swarm_access.SwarmAuthorizer(client_key, key, RUN, fetch=lambda: access, first_token=access)
    server_access = swarm_access.to_access_token(server_token)
    variants = {
        "verified every time": VerifiedEveryTime(server_key, key, RUN, lambda: server_access, server_access),
        "remembered": swarm_access.SwarmAuthorizer(server_key, key, RUN, lambda: server_access, server_access),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):  # interleaved: both see the same machine
        for name, server in variants.items():
            times[name].append(per_request(server, requests(client, args.requests)))
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (run it with nothing else on the machine)")
    base = statistics.median(times["verified every time"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:>20}: {median * 1e6:7.1f} us per request ({median / base:.2f}x)")


if __name__ == "__main__":
    main()
