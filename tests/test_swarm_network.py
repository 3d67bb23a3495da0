"""Swarm network settings for a server behind a firewall or NAT: the server's peers take their ports from
SWARMHUB_SWARM_PORTS (skipping ports in use) and announce SWARMHUB_SWARM_ANNOUNCE_HOST to workers; bad values
stop the server at start with a message that names the setting."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from hivemind.utils.crypto import RSAPrivateKey
from pydantic import ValidationError

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.server.swarm import SwarmHost
from swarmhub.worker.swarm import access as swarm_access

from .conftest import api_token, free_port, make_experiment, make_user
from .swarm_processes import TAG, kill_all, wait_gone

PUBLIC_HOST = "203.0.113.7"  # TEST-NET-3: never dialled here, only announced


def free_ports(count: int) -> range:
    """``count`` consecutive ports nothing listens on now."""
    for _ in range(200):
        start = free_port()
        ports = range(start, start + count)
        if ports.stop <= 65536 and all(_free(port) for port in ports):
            return ports
    raise RuntimeError(f"no {count} consecutive free ports")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def listener(port: int) -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def port_of(maddr: str) -> int:
    parts = maddr.split("/")
    return int(parts[parts.index("tcp") + 1])


def accepts_connections(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def tag(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Marks every process the test starts (the peers inherit it), to prove none is left behind."""
    tag = f"network-{uuid.uuid4().hex}"
    monkeypatch.setenv(TAG, tag)
    yield tag
    left = wait_gone(tag, timeout=20)
    kill_all(left)
    assert not left, f"processes left behind: {[p.name() for p in left]}"


@pytest.mark.parametrize(
    ("field", "value", "name"),
    [
        ("swarm_ports", "5-3", "SWARMHUB_SWARM_PORTS"),
        ("swarm_ports", "0-100", "SWARMHUB_SWARM_PORTS"),
        ("swarm_ports", "65000-65536", "SWARMHUB_SWARM_PORTS"),
        ("swarm_ports", "40000:40099", "SWARMHUB_SWARM_PORTS"),
        ("swarm_host", "localhost", "SWARMHUB_SWARM_HOST"),
        ("swarm_host", "10.0.0.300", "SWARMHUB_SWARM_HOST"),
        ("swarm_announce_host", "https://hub.example.org", "SWARMHUB_SWARM_ANNOUNCE_HOST"),
        ("swarm_announce_host", "203.0.113.7:40000", "SWARMHUB_SWARM_ANNOUNCE_HOST"),
        ("swarm_announce_host", "0.0.0.0", "SWARMHUB_SWARM_ANNOUNCE_HOST"),
        ("swarm_announce_host", "300.1.2.3", "SWARMHUB_SWARM_ANNOUNCE_HOST"),
    ],
)
def test_bad_network_settings_are_refused_naming_the_setting(
    field: str, value: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(name, value)
    if field == "swarm_announce_host":
        monkeypatch.setenv("SWARMHUB_SWARM_PORTS", "40000-40099")
    with pytest.raises(ValidationError) as refused:
        Settings()
    (error,) = refused.value.errors()
    assert error["loc"] == (field,)
    assert name in error["msg"] and repr(value) in error["msg"]


def test_an_announce_host_needs_the_port_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWARMHUB_SWARM_ANNOUNCE_HOST", PUBLIC_HOST)
    with pytest.raises(ValidationError, match="SWARMHUB_SWARM_ANNOUNCE_HOST needs SWARMHUB_SWARM_PORTS"):
        Settings()
    monkeypatch.setenv("SWARMHUB_SWARM_PORTS", " 40000 - 40099 ")
    settings = Settings()
    assert settings.swarm_port_range == range(40000, 40100)
    assert (settings.swarm_announce_host, Settings(swarm_ports="40000").swarm_port_range) == (
        PUBLIC_HOST,
        range(40000, 40001),
    )
    assert Settings(swarm_announce_host="hub.example.org", swarm_ports="1-65535").swarm_port_range == range(1, 65536)


def test_the_server_does_not_start_with_a_bad_port_range(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SWARMHUB_DATA_DIR": str(tmp_path),
        "SWARMHUB_ENVIRONMENT": "test",
        "SWARMHUB_SWARM_PORTS": "5-3",
    }
    result = subprocess.run(
        [sys.executable, "-m", "swarmhub.worker.cli.main", "server", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert "SWARMHUB_SWARM_PORTS='5-3' is not a port range" in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr  # one line per bad setting, not a stack


@pytest.mark.swarm
def test_workers_get_the_announced_host_and_a_port_from_the_range(settings, db, tag) -> None:
    ports = free_ports(3)
    busy = listener(ports[0])  # something else already took the first port of the range
    network = settings.model_copy(
        update={
            "swarm_enabled": True,
            "swarm_ports": f"{ports.start}-{ports.stop - 1}",
            "swarm_announce_host": PUBLIC_HOST,
        }
    )
    owner = make_user(db, "olga")
    make_experiment(db, owner, slug="behind-nat", status="running")
    try:
        with TestClient(create_app(network)) as client:
            headers = api_token(client, "olga")
            join_body = {"peer_public_key": swarm_access.public_key_text(RSAPrivateKey())}
            deadline, initial_peers = time.monotonic() + 90, []
            while not initial_peers:
                assert time.monotonic() < deadline, "the experiment's peer never published its addresses"
                time.sleep(0.5)
                response = client.post("/api/experiments/behind-nat/join", headers=headers, json=join_body)
                if response.status_code == 200:
                    initial_peers = response.json()["initial_peers"]
            # Workers are told to dial the public address only, on a port of the range, never the busy one.
            assert {maddr.split("/tcp/")[0] for maddr in initial_peers} == {f"/ip4/{PUBLIC_HOST}"}, initial_peers
            (port,) = {port_of(maddr) for maddr in initial_peers}
            assert port in ports and port != ports[0]
            assert accepts_connections(port)  # ... and the peer does listen there (the NAT forwards to it)
    finally:
        busy.close()


@pytest.mark.swarm
def test_a_full_range_is_logged_and_retried_not_fatal(tmp_path: Path, tag, caplog) -> None:
    (port,) = ports = free_ports(1)
    busy = listener(port)
    host = SwarmHost(tmp_path, "127.0.0.1", ports=ports)
    run_id = f"t-{uuid.uuid4().hex[:8]}"
    key = swarm_access.new_signing_key_der()
    try:
        with caplog.at_level(logging.ERROR, logger="swarmhub.swarm"):
            host.reconcile({run_id: (key, [], None, None)})  # as the server's loop does: it must not raise
            host.reconcile({run_id: (key, [], None, None)})
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors  # once, not at every reconcile
        assert f"no free port left in SWARMHUB_SWARM_PORTS={port}-{port}" in errors[0]
        assert host.hosted() == []

        busy.close()  # the port is free again: the next reconcile starts the peer on it
        host.reconcile({run_id: (key, [], None, None)})
        peer = host.start(run_id, key)
        assert peer is not None and peer.ready.wait(90), "the peer did not start"
        # no announce host: workers get the address the peer listens on
        assert [maddr.split("/p2p/")[0] for maddr in host.maddrs(run_id)] == [f"/ip4/127.0.0.1/tcp/{port}"]
    finally:
        busy.close()
        host.close()
