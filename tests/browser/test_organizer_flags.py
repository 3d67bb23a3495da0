"""In real Chromium: the organizer's dashboard shows a volunteer's implausible claims (its fetches carry the session
cookie, which API reads accept), and a visitor's does not."""

from __future__ import annotations

import json

import httpx
import pytest
from playwright.sync_api import expect
from websockets.sync.client import connect

from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments
from swarmhub.server.accounts import users as accounts
from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.server.services import services

from ..conftest import PASSWORD, LiveServer

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


@pytest.fixture
def claimed(tmp_path):
    """A running experiment of olga's where mallory's worker reported 1,000,000 samples that no round backs."""
    settings = Settings(
        environment="test",
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'b.db'}",
        swarm_enabled=False,  # the reports are what is judged here: no swarm to run
    )
    app = create_app(settings)
    with LiveServer(app) as server:
        with services(app).sessionmaker.begin() as session:
            olga = accounts.create_user(session, "olga", PASSWORD)
            mallory = accounts.create_user(session, "mallory", PASSWORD)
            # a claim is flagged past the backed samples plus two target batches: a small target, named
            fields = {"slug": "open", "title": "Open", "task": "digits", "target_batch_size": 4096}
            experiment = experiments.create(session, olga, experiments.ExperimentCreate(**fields))
            experiment.status = "running"
            worker_id = experiments.start_worker_run(session, experiment, mallory, "cpu").id
        token = server_token(server.url, "mallory")
        url = f"ws://127.0.0.1:{server.port}/ws/experiments/open/report?worker_id={worker_id}"
        with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=60) as ws:
            ws.send(
                MetricReport(
                    seq=0, step=1, epoch=0, samples=1_000_000, loss=2.0, samples_per_second=100.0, peers=2
                ).model_dump_json()
            )
            assert json.loads(ws.recv())["type"] == "ack"
        yield server


def server_token(url: str, username: str) -> str:
    response = httpx.post(f"{url}/api/auth/token", json={"username": username, "password": PASSWORD}, timeout=60)
    return response.json()["access_token"]


def test_the_organizer_sees_an_implausible_claim_and_a_visitor_does_not(claimed, page):
    base = claimed.url
    page.goto(f"{base}/experiments/open")  # a visitor
    expect(page.locator("#leaderboard tbody")).to_contain_text("mallory", timeout=30_000)
    expect(page.locator("#flags")).to_have_count(0)

    page.goto(f"{base}/login")
    page.fill("input[name=username]", "olga")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.goto(f"{base}/experiments/open")
    expect(page.locator("#flags")).to_contain_text("mallory: claims 1,000,000 samples", timeout=30_000)
    expect(page.locator("#flags")).not_to_contain_text("Nothing implausible so far")
