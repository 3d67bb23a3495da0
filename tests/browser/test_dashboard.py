"""In real Chromium (Debian's, driven by Playwright): an organizer signs up, creates an experiment through the
form (fixing an inline error first), starts it, and watches the dashboard draw new points while a real
`swarmhub join` worker reports, without reloading the page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.worker.tasks import get_task

from ..conftest import PASSWORD, LiveServer
from .conftest import ARTIFACTS, shown, sign_up

# The dashboard picture the README and the docs' home page show, taken afresh by every run of this test.
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path):
    settings = Settings(
        environment="test",
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'browser.db'}",
        live_interval_seconds=0.5,
    )
    with LiveServer(create_app(settings)) as live:
        yield live


def test_organizer_creates_experiment_and_watches_it_live(server, page, tmp_path):
    base = server.url
    sign_up(page, base, "organizer")

    page.goto(f"{base}/experiments/new")
    page.fill("input[name=title]", "Browser digits")
    page.fill("input[name=slug]", "Bad Slug!")
    page.fill("input[name='param.digits.hidden_size']", "32")
    page.fill("input[name=target_batch_size]", "4096")
    page.fill("input[name=matchmaking_time]", "1")
    expect(page.locator("#rate-cap-value")).to_have_text("4,096")  # the swarm's cap, as the fields are typed
    page.click("#experiment-form button[type=submit]")
    expect(page.locator("#error-slug")).to_contain_text("lowercase letters")
    expect(page.locator("input[name=title]")).to_have_value("Browser digits")  # nothing typed is lost

    page.fill("input[name=slug]", "browser-digits")
    page.click("#experiment-form button[type=submit]")
    expect(page).to_have_url(f"{base}/experiments/browser-digits")
    page.click("button[value=start]")
    expect(page.locator("#status")).to_have_text("running")

    page.goto(f"{base}/account")
    page.fill("input[name=name]", "browser test worker")
    page.click("text=Create token")
    token = page.locator("#new-token").inner_text()

    page.goto(f"{base}/experiments/browser-digits")
    # the live socket opens within seconds; 15 s: the suite's other lane may hold both cores meanwhile
    expect(page.locator("#live-state")).to_have_text("live", timeout=15_000)
    chart = page.locator("#chart-loss")
    expect(chart).to_have_attribute("data-points", "0")
    # The loss to beat, before any training: what a model that knows only the digits' frequencies scores.
    prior = get_task("digits")().baseline()
    expect(chart).to_have_attribute("data-reference", str(prior.cross_entropy))
    expect(page.locator("#loss-baseline")).to_contain_text("knows only how often each digit occurs")
    expect(page.locator("#loss-baseline .baseline-loss")).to_have_text(shown(prior.cross_entropy, 3))
    expect(page.locator("#loss-baseline .baseline-top1")).to_have_text(shown(100 * prior.top1, 1) + " %")

    env = {
        **os.environ,
        "SWARMHUB_SERVER": base,
        "SWARMHUB_TOKEN": token,
        "SWARMHUB_CONFIG_DIR": str(tmp_path / "cfg"),
        "SWARMHUB_STATE_DIR": str(tmp_path / "state"),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "swarmhub.worker.cli.main",
            "join",
            "browser-digits",
            "--max-steps",
            "2000",
            "--listen",
            "/ip4/127.0.0.1/tcp/0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        # New points arrive over the live channel: no reload happens between these checks. The worker's start
        # (its imports, the swarm's) took more than 90 s once on a slow machine running the other lanes.
        expect(chart).not_to_have_attribute("data-points", "0", timeout=150_000)
        first = int(chart.get_attribute("data-points"))
        expect(chart.locator("canvas")).to_have_count(1)
        expect(page.locator("#leaderboard tbody")).to_contain_text("organizer", timeout=30_000)
        page.wait_for_function(
            "n => Number(document.querySelector('#chart-loss').dataset.points) > n", arg=first, timeout=60_000
        )
        expect(page.locator("#stat-claimed")).not_to_have_text(re.compile(r"^(–|0)$"))
        # Verified samples follow once the swarm closes an epoch and its monitor has read the signed records.
        expect(page.locator("#stat-samples")).not_to_have_text(re.compile(r"^(–|0)$"), timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
        DOCS_IMG.mkdir(exist_ok=True)
        page.screenshot(path=str(DOCS_IMG / "dashboard.png"), full_page=True)
    finally:
        worker.terminate()
        output = worker.communicate(timeout=60)[0].decode(errors="replace")
        print(output)  # shown by pytest when the test fails
    assert "Traceback" not in output, output


PAYLOAD = "<img src=x onerror=alert(1)>"


def test_markup_in_names_and_text_never_runs(server, page):
    """A hostile sign-up name, experiment title and description are shown as text wherever they appear, and no
    script runs: templates escape them, and the Content-Security-Policy would block inline script anyway."""
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
    base = server.url

    page.goto(f"{base}/signup")
    page.fill("input[name=username]", PAYLOAD)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("#error-username")).to_be_visible()  # refused, with the name kept as typed
    expect(page.locator("input[name=username]")).to_have_value(PAYLOAD)
    assert page.locator("img[src=x]").count() == 0

    page.fill("input[name=username]", "organizer")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("header nav")).to_contain_text("organizer")
    page.goto(f"{base}/experiments/new")
    page.fill("input[name=title]", PAYLOAD)
    page.fill("input[name=slug]", "hostile")
    page.fill("textarea[name=description]", "<script>alert(2)</script>")
    page.click("#experiment-form button[type=submit]")
    expect(page).to_have_url(f"{base}/experiments/hostile")
    page.click("button[value=start]")
    for path in ("/experiments/hostile", "/", "/experiments/hostile/edit"):
        page.goto(f"{base}{path}")
        page.wait_for_load_state("networkidle")
        assert page.locator("img[src=x]").count() == 0, path
        assert page.locator("script:not([src])").count() == 0, path  # not one inline script on our pages
    page.goto(f"{base}/experiments/hostile")
    expect(page.locator("h1")).to_contain_text(PAYLOAD)  # shown as the text it is
    expect(page.locator("#live-state")).to_have_text("live")  # our own scripts still run under the policy
    assert dialogs == [], dialogs
    assert violations == [], violations
