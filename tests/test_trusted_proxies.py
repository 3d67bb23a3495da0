"""X-Forwarded-For is believed only from SWARMHUB_TRUSTED_PROXIES, against a real `swarmhub server` process: a
client that writes the header itself escapes no login limit and cannot aim the reachability probe at another
address; behind a listed proxy the client is the address that proxy saw."""

from __future__ import annotations

import socket

import httpx

from .conftest import free_port
from .processes import running_server, signup


def failed_logins(url: str, forwarded: list[str]) -> list[int]:
    return [
        httpx.post(
            f"{url}/api/auth/token",
            json={"username": "nobody", "password": "wrong-password-x"},
            headers={"X-Forwarded-For": value},
        ).status_code
        for value in forwarded
    ]


def dialed_back(url: str, token: str, forwarded: str) -> str:
    """Where the server dialed to check a worker listening on every interface of this machine."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", free_port()))
    listener.listen()
    try:
        port = listener.getsockname()[1]
        answer = httpx.post(
            f"{url}/api/probe/reachability",
            headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": forwarded},
            json={"maddrs": [f"/ip4/0.0.0.0/tcp/{port}"]},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["results"][0]["dialed"]
    finally:
        listener.close()


def client_seen(url: str, token: str, forwarded: str) -> str:
    info = httpx.get(f"{url}/api/probe", headers={"Authorization": f"Bearer {token}", "X-Forwarded-For": forwarded})
    return info.json()["client_host"]


def test_without_trusted_proxies_the_header_is_ignored(tmp_path):
    with running_server(tmp_path, swarm_enabled="false") as (url, _):
        token = signup(url, "ada")  # its log-in counts too: 29 attempts are left to this address
        assert client_seen(url, token, "203.0.113.7") == "127.0.0.1"
        assert dialed_back(url, token, "203.0.113.7").startswith("127.0.0.1:")  # never the address it wrote
        codes = failed_logins(url, [f"198.51.100.{i}" for i in range(30)])
        assert codes[:29] == [401] * 29 and codes[29] == 429, codes  # one address, however it signs its requests


def test_behind_a_trusted_proxy_the_client_is_the_address_the_proxy_saw(tmp_path):
    with running_server(tmp_path, swarm_enabled="false", trusted_proxies="127.0.0.1") as (url, _):
        token = signup(url, "ada")
        assert client_seen(url, token, "203.0.113.7") == "203.0.113.7"
        # a client that prepends its own entries: the proxy appended the address it saw, which is what counts
        assert client_seen(url, token, "6.6.6.6, 203.0.113.7") == "203.0.113.7"
        codes = failed_logins(url, [f"10.0.0.{i}, 192.0.2.50" for i in range(31)])
        assert codes[:30] == [401] * 30 and codes[30] == 429, codes
        assert failed_logins(url, ["192.0.2.51"]) == [401]  # another client behind the proxy is not limited by it
