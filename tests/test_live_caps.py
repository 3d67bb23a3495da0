"""Live dashboard sockets are capped per client address and per experiment: a script that opens socket after
socket gets a close with 1013 (try again later) and a reason, and other viewers still get in."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
import websockets

from swarmhub.server.app import create_app

from .conftest import LiveServer, make_experiment, make_user


async def open_viewer(port: int, slug: str, address: str) -> tuple[websockets.ClientConnection | None, str]:
    """A dashboard socket from ``address`` (a loopback address of its own); returns (socket, "") when it got its
    first snapshot, or (None, "<code> <reason>") when the server closed it."""
    # the caps are asserted, not the latency: one handshake took over websockets' default 10 s on a loaded machine
    url = f"ws://127.0.0.1:{port}/ws/experiments/{slug}/live"
    ws = await websockets.connect(url, local_addr=(address, 0), open_timeout=60)
    try:
        snapshot = json.loads(await asyncio.wait_for(ws.recv(), 60))
    except websockets.ConnectionClosed as closed:
        return None, f"{closed.rcvd.code} {closed.rcvd.reason}" if closed.rcvd else "no close frame"
    assert "metrics" in snapshot
    return ws, ""


@pytest.fixture
def capped_server(settings, db):
    owner = make_user(db)
    for slug in ("busy", "quiet"):
        make_experiment(db, owner, slug=slug, status="running")
    app = create_app(settings.model_copy(update={"live_max_per_address": 3, "live_max_per_experiment": 5}))
    with LiveServer(app) as server:
        yield server


def test_one_address_holds_at_most_its_share_of_live_sockets(capped_server):
    async def scenario() -> None:
        port = capped_server.port
        held = [await open_viewer(port, "busy", "127.0.0.1") for _ in range(3)]
        assert all(ws is not None for ws, _ in held)
        ws, why = await open_viewer(port, "busy", "127.0.0.1")
        assert ws is None and why.startswith("1013 too many live dashboards from your address"), why
        other, _ = await open_viewer(port, "busy", "127.0.0.2")  # another viewer still gets in
        assert other is not None
        await held[0][0].close()
        await asyncio.sleep(0.2)
        again, why = await open_viewer(port, "busy", "127.0.0.1")  # a seat given back is free again
        assert again is not None, why
        for socket in [*(w for w, _ in held[1:]), other, again]:
            with contextlib.suppress(Exception):
                await socket.close()

    asyncio.run(scenario())


def test_one_experiment_holds_at_most_its_share_of_live_sockets(capped_server):
    async def scenario() -> None:
        port = capped_server.port
        held = [await open_viewer(port, "busy", f"127.0.0.{10 + i}") for i in range(5)]
        assert all(ws is not None for ws, _ in held)
        ws, why = await open_viewer(port, "busy", "127.0.0.20")
        assert ws is None and why.startswith("1013 this dashboard has its most viewers (5)"), why
        other, why = await open_viewer(port, "quiet", "127.0.0.20")  # another experiment's dashboard is open
        assert other is not None, why
        for socket in [*(w for w, _ in held), other]:
            with contextlib.suppress(Exception):
                await socket.close()

    asyncio.run(scenario())
