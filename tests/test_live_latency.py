"""The live channel's leading-edge throttle, through a real uvicorn server: after a quiet spell a report reaches
the dashboards at once, not an interval later, and a burst of reports still makes one more push per interval."""

from __future__ import annotations

import asyncio
import json

import websockets

from swarmhub.server.app import create_app

from .conftest import LiveServer, api_token, make_experiment, make_user
from .support import report, worker_run

INTERVAL = 5.0  # long, so that "at once" and "an interval later" cannot be confused


async def watch(port: int, headers: dict[str, str], worker_id: str) -> list[tuple[float, int]]:
    """Report once after a quiet spell, then a burst; return (seconds after the first report, total samples)
    for each push the dashboard received until well after the burst's interval ended."""
    loop = asyncio.get_running_loop()
    base = f"ws://127.0.0.1:{port}/ws/experiments/quiet"
    pushes: list[tuple[float, int]] = []
    async with (
        websockets.connect(f"{base}/live", open_timeout=60) as viewer,  # the handshake is not what is timed
        websockets.connect(
            f"{base}/report?worker_id={worker_id}", additional_headers=headers, open_timeout=60
        ) as worker,
    ):
        json.loads(await asyncio.wait_for(viewer.recv(), 10))  # the snapshot on connect
        start = loop.time()
        for seq in range(6):  # one report, then five more inside the interval its push opens
            await worker.send(report(seq, samples=100 * (seq + 1)))
            assert json.loads(await asyncio.wait_for(worker.recv(), 10))["type"] == "ack"
            if seq == 0:
                first = json.loads(await asyncio.wait_for(viewer.recv(), INTERVAL / 2))
                pushes.append((loop.time() - start, first["metrics"]["summary"]["total_samples"]))
        deadline = start + 2 * INTERVAL - 1
        while (left := deadline - loop.time()) > 0:
            try:
                message = json.loads(await asyncio.wait_for(viewer.recv(), left))
            except TimeoutError:
                break
            pushes.append((loop.time() - start, message["metrics"]["summary"]["total_samples"]))
    return pushes


def test_a_report_after_a_quiet_spell_is_pushed_at_once_and_a_burst_waits_for_the_interval(settings, client, db):
    alice = make_user(db)
    make_experiment(db, alice, slug="quiet", status="running")
    headers, worker_id = api_token(client), worker_run(db, alice, "quiet")
    app = create_app(settings.model_copy(update={"live_interval_seconds": INTERVAL}))
    with LiveServer(app) as server:
        pushes = asyncio.run(watch(server.port, headers, worker_id))
    (first_at, first_total), *rest = pushes
    assert first_total == 100
    assert first_at < INTERVAL / 2, "the first report waited for the interval instead of going out at once"
    # The burst rides on one push, one interval after the first: two pushes in that interval, not six.
    assert [total for _, total in rest] == [600]
    assert rest[0][0] >= first_at + INTERVAL - 0.5
