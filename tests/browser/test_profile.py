"""In real Chromium: a volunteer's name on the dashboard's leaderboard leads to their public page, which shows a
hostile name and experiment title as the text they are (no markup, no script), and draws their verified samples
over time; an unknown name gets the 404 page."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from swarmhub.server.models import User, utcnow
from swarmhub.server.services import services

from ..conftest import LiveServer, make_experiment, make_user
from ..support import observe, witness
from .conftest import ARTIFACTS, browser_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

PAYLOAD = "<img src=x onerror=alert(1)>"


@pytest.fixture
def server(tmp_path: Path):
    app = browser_app(tmp_path)
    with LiveServer(app) as live:
        db = services(app).sessionmaker
        olga = make_user(db, "olga")
        make_user(db, "ada")
        with db.begin() as session:
            # Sign-up refuses such a name; one stored by an older rule or by an operator must still be text.
            session.add(User(username=PAYLOAD, password_hash="not a hash: cannot log in"))
        experiment = make_experiment(db, olga, slug="hostile", status="running", title=PAYLOAD)
        t0 = utcnow() - timedelta(minutes=30)
        for minute in range(0, 30, 3):  # a round every three minutes, for half an hour
            at = t0 + timedelta(minutes=minute)
            observe(db, experiment.id, at, (PAYLOAD, "QmX", minute, 40), ("ada", "QmA", minute, 20))
            witness(db, experiment.id, at, f"round-{minute}", minute, [(PAYLOAD, "QmX", 40.0), ("ada", "QmA", 20.0)])
        yield live


def test_leaderboard_links_to_a_profile_that_shows_markup_as_text(server, page):
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
    base = server.url

    page.goto(f"{base}/experiments/hostile")
    link = page.locator("#leaderboard tbody a", has_text=PAYLOAD)
    expect(link).to_have_attribute("href", f"/u/{quote(PAYLOAD, safe='')}")
    link.click()
    expect(page).to_have_url(f"{base}/u/{quote(PAYLOAD, safe='')}")
    page.wait_for_load_state("networkidle")
    expect(page.locator("h1")).to_have_text(PAYLOAD)
    experiment = page.locator("#experiments a")
    expect(experiment).to_have_text(PAYLOAD)
    expect(experiment).to_have_attribute("href", "/experiments/hostile")
    expect(page.locator("#experiments tr[data-slug=hostile] .share")).to_have_text("50.0 %")  # 40 of each 80
    assert page.locator("img[src=x]").count() == 0
    assert page.locator("script:not([src])").count() == 0  # not one inline script
    # The chart is drawn from the profile's JSON by our own script, under the Content-Security-Policy.
    page.wait_for_function("Number(document.querySelector('#chart-history').dataset.points) > 1")
    assert page.locator("#chart-history canvas").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "profile.png"), full_page=True)

    missing = page.goto(f"{base}/u/nobody")
    assert missing is not None and missing.status == 404
    expect(page.locator("h1")).to_have_text("404")
    assert dialogs == [], dialogs
    assert violations == [], violations
