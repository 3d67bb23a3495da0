"""Live updates across server processes through Redis (127.0.0.1:6379): a worker reports to one server, a
dashboard connected to another sees the new numbers. Without Redis, the other server never hears of it."""

from __future__ import annotations

import asyncio
import json
import uuid

import websockets

from swarmhub.server.app import create_app

from .conftest import LiveServer, api_token, make_experiment, make_user
from .support import report, worker_run


async def next_update(url: str, trigger, timeout: float) -> dict | None:
    """Connect a dashboard to ``url``, run ``trigger``, return the first snapshot after the initial one."""
    async with websockets.connect(url, open_timeout=60) as viewer:  # a handshake on a loaded machine can take >10 s
        json.loads(await asyncio.wait_for(viewer.recv(), 10))  # the snapshot on connect
        await asyncio.get_running_loop().run_in_executor(None, trigger)
        try:
            return json.loads(await asyncio.wait_for(viewer.recv(), timeout))
        except TimeoutError:
            return None


def run_case(settings, client, db, redis_url: str, wait: float) -> dict | None:
    alice = make_user(db)
    make_experiment(db, alice, slug="shared", status="running")
    headers, worker_id = api_token(client), worker_run(db, alice, "shared")
    channel = f"swarmhub-test:{uuid.uuid4().hex}"  # tests running at once must not hear each other
    apps = [
        create_app(settings.model_copy(update={"redis_url": redis_url, "redis_channel": channel})) for _ in range(2)
    ]
    with LiveServer(apps[0]) as server_a, LiveServer(apps[1]) as server_b:

        def worker_reports_to_a() -> None:
            from websockets.sync.client import connect

            url = f"ws://127.0.0.1:{server_a.port}/ws/experiments/shared/report?worker_id={worker_id}"
            with connect(url, additional_headers=headers, open_timeout=60) as ws:
                ws.send(report(0, samples=4242))
                assert json.loads(ws.recv())["type"] == "ack"

        return asyncio.run(
            next_update(f"ws://127.0.0.1:{server_b.port}/ws/experiments/shared/live", worker_reports_to_a, wait)
        )


def test_dashboards_on_another_server_get_the_update_through_redis(settings, client, db):
    update = run_case(settings, client, db, "redis://127.0.0.1:6379/0", wait=30.0)
    assert update is not None, "the dashboard on the other server never heard of the report"
    assert update["metrics"]["summary"]["total_samples"] == 4242


def test_without_redis_each_server_is_alone(settings, client, db):
    assert run_case(settings, client, db, "", wait=5.0) is None  # the other server stays silent
