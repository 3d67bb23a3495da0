"""In real Chromium: the front page shows the collaborations' figures and follows a new report without a reload;
the site's icon answers; the new-experiment form labels task parameters by their titles and keeps the auxiliary
peer's checkbox on the line of its label."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect
from websockets.sync.client import connect

from swarmhub.server.services import services

from ..conftest import PASSWORD, LiveServer, make_experiment, make_user
from ..support import report, worker_run
from .conftest import ARTIFACTS, browser_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]
TITLE = "<i>ALBERT</i> together"


@pytest.fixture
def server(tmp_path: Path):
    with LiveServer(browser_app(tmp_path)) as live:
        yield live


def send_reports(server: LiveServer, username: str, slug: str, count: int) -> None:
    """Reports as a worker sends them: a bearer token from the real route, the real report websocket."""
    db = services(server.server.config.app).sessionmaker
    user = make_user(db, username)
    token = httpx.post(f"{server.url}/api/auth/token", json={"username": username, "password": PASSWORD}, timeout=60)
    headers = {"Authorization": f"Bearer {token.json()['access_token']}"}
    worker_id = worker_run(db, user, slug)
    address = f"{server.url.replace('http', 'ws', 1)}/ws/experiments/{slug}/report?worker_id={worker_id}"
    with connect(address, additional_headers=headers, open_timeout=60) as ws:
        for seq in range(count):
            ws.send(report(seq, samples=32 * (seq + 1)))
            assert json.loads(ws.recv(timeout=10)) == {"type": "ack", "seq": seq}


def test_front_page_shows_the_collaborations_and_follows_a_new_report(server, page):
    db = services(server.server.config.app).sessionmaker
    olga = make_user(db, "olga")
    params = {"size": "tiny", "warmup_steps": 10, "total_steps": 1000}
    make_experiment(db, olga, slug="albert-live", status="running", title=TITLE, task="albert-mlm", task_params=params)
    send_reports(server, "ada", "albert-live", 6)  # epoch 1, 100 samples/s

    page.goto(server.url)
    row = page.locator('tr[data-slug="albert-live"]')
    expect(row.locator("a")).to_have_text(TITLE)  # shown as text
    assert row.locator("a i").count() == 0
    expect(row.locator(".fig-online")).to_have_text("1")
    expect(row.locator(".fig-sps")).to_have_text("100.0")
    expect(row.locator(".fig-steps")).to_have_text("step 1 of 1,000")
    expect(row.locator(".fig-eta")).to_have_text("about 21 min to go")  # 999 steps of 128 samples at 100/s
    expect(page.locator("#hub-online")).to_have_text("1")
    page.evaluate("window.notReloaded = true")

    send_reports(server, "bob", "albert-live", 2)  # a second volunteer: twice the rate
    expect(row.locator(".fig-online")).to_have_text("2", timeout=20_000)
    expect(page.locator("#hub-online")).to_have_text("2")
    expect(row.locator(".fig-sps")).to_have_text("200.0")
    expect(row.locator(".fig-eta")).to_have_text("about 10 min to go")
    assert page.evaluate("window.notReloaded") is True
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "front-page.png"), full_page=True)


def test_favicon_and_the_experiment_form(server, page):
    assert page.request.get(f"{server.url}/favicon.ico").status == 200
    page.goto(f"{server.url}/signup")
    page.fill("input[name=username]", "organizer")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("header nav")).to_contain_text("organizer")
    icon = page.locator('link[rel="icon"]').get_attribute("href")
    assert icon and page.request.get(f"{server.url}{icon}").status == 200

    page.goto(f"{server.url}/experiments/new")
    hidden = page.locator("label", has=page.locator("input[name='param.digits.hidden_size']"))
    expect(hidden).to_contain_text("Hidden units")
    expect(hidden).not_to_contain_text("hidden_size")

    box = page.locator("input[type=checkbox][name=aux_peer]").bounding_box()
    # The label's own words (its first text after the checkbox), measured where the browser laid them out
    words = page.evaluate(
        """() => {
            const label = document.querySelector("input[type=checkbox][name=aux_peer]").closest("label");
            const text = [...label.childNodes].find(n => n.nodeType === Node.TEXT_NODE && n.textContent.trim());
            const range = document.createRange();
            range.selectNodeContents(text);
            const r = range.getClientRects()[0];
            return {x: r.x, y: r.y, width: r.width, height: r.height, text: text.textContent.trim()};
        }"""
    )
    assert words["text"].startswith("The server runs an auxiliary peer")
    assert box is not None
    assert box["width"] < 40, box  # a checkbox, not a line-wide block
    assert box["x"] + box["width"] <= words["x"], (box, words)  # before the words ...
    middle = box["y"] + box["height"] / 2
    assert words["y"] <= middle <= words["y"] + words["height"], (box, words)  # ... on their line
