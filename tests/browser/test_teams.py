"""In real Chromium: a team's name on the dashboard's Teams table leads to the team's page, which shows a hostile
name and description as the text they are (no markup, no script), with its members' verified samples; the page's
moderation controls show to whom they serve (rename: the founder and hub administrators; remove: administrators)
and work as forms."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from playwright.sync_api import expect

from swarmhub.server.models import Team, TeamMember, User, utcnow
from swarmhub.server.services import services

from ..conftest import PASSWORD, LiveServer, make_experiment, make_user
from ..support import observe, witness
from .conftest import ARTIFACTS, browser_app

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

PAYLOAD = "<img src=x onerror=alert(1)>"
DESCRIPTION = "<script>alert('team')</script><b>bold</b>"


@pytest.fixture
def server(tmp_path: Path):
    app = browser_app(tmp_path)
    with LiveServer(app) as live:
        db = services(app).sessionmaker
        olga = make_user(db, "olga")
        ada = make_user(db, "ada")
        make_user(db, "vic")
        with db.begin() as session:
            # The create route refuses such a name; one stored by an older rule or by an operator must still be text.
            team = Team(name=PAYLOAD, description=DESCRIPTION, founder_id=ada.id, creator_id=ada.id)
            session.add(team)
            session.flush()
            session.add(TeamMember(user_id=ada.id, team_id=team.id, role="admin"))
            session.add(User(username="grace", password_hash="not a hash: cannot log in"))
        experiment = make_experiment(db, olga, slug="hostile", status="running", title=PAYLOAD)
        at = utcnow() - timedelta(minutes=1)
        observe(db, experiment.id, at, ("ada", "QmA", 1, 40), ("grace", "QmG", 1, 20))
        witness(db, experiment.id, at, "round-1", 1, [("ada", "QmA", 40.0), ("grace", "QmG", 20.0)])
        yield live


def test_dashboard_team_table_links_to_a_team_page_that_shows_markup_as_text(server, page):
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    base = server.url

    # What the ledger credited each (its rules are its own tests'): the team's figures are ada's alone.
    ada, grace = (page.request.get(f"{base}/api/users/{name}").json()["verified_samples"] for name in ("ada", "grace"))
    assert ada > 0 and grace > 0
    page.goto(f"{base}/experiments/hostile")
    row = page.locator("#teams tbody tr")
    expect(row).to_have_count(1)  # grace is in no team
    link = row.locator("a", has_text=PAYLOAD)
    expect(link).to_have_attribute("href", f"/teams/{quote(PAYLOAD, safe='')}")
    expect(row.locator(".verified")).to_have_text(f"{ada:,}")
    expect(row.locator(".share")).to_have_text(f"{100 * round(ada / (ada + grace), 4):.1f} %")
    link.click()
    expect(page).to_have_url(f"{base}/teams/{quote(PAYLOAD, safe='')}")
    expect(page.locator("h1")).to_have_text(PAYLOAD)
    expect(page.locator("#description")).to_have_text(DESCRIPTION)
    expect(page.locator("#members tr[data-username=ada] .verified")).to_have_text(f"{ada:,}")
    expect(page.locator("#experiments a")).to_have_text(PAYLOAD)
    assert page.locator("img[src=x]").count() == 0 and page.locator("#description b").count() == 0
    assert page.locator("script:not([src])").count() == 0  # not one inline script

    page.goto(f"{base}/teams")
    expect(page.locator(f"#teams tr[data-team='{PAYLOAD}'] .verified")).to_have_text(f"{ada:,}")
    assert page.locator("img[src=x]").count() == 0
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "teams.png"), full_page=True)
    assert dialogs == []


def log_in(page, base: str, username: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{base}/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page).not_to_have_url(f"{base}/login")


def test_moderation_controls_show_to_administrators_and_the_founder_only(server, page):
    base = server.url
    team_url = f"{base}/teams/{quote(PAYLOAD, safe='')}"
    page.goto(team_url)  # a visitor
    expect(page.locator("#team")).to_be_visible()
    expect(page.locator("#moderation")).to_have_count(0)
    log_in(page, base, "vic")  # signed in, in no team
    page.goto(team_url)
    expect(page.locator("#join")).to_be_visible()
    expect(page.locator("#moderation")).to_have_count(0)
    log_in(page, base, "ada")  # the founder renames, never removes
    page.goto(team_url)
    expect(page.locator("#rename-team")).to_be_visible()
    expect(page.locator("#remove-team")).to_have_count(0)

    log_in(page, base, "olga")  # the hub's administrator (the first account)
    page.goto(team_url)
    expect(page.locator("#remove-team")).to_be_visible()
    page.fill("#rename-team input[name=name]", "calm")
    page.click("#rename-team button[type=submit]")
    expect(page).to_have_url(f"{base}/teams/calm")
    expect(page.locator("h1")).to_have_text("calm")
    expect(page.locator("#members tr[data-username=ada]")).to_have_count(1)
    page.click("#remove-team button")
    expect(page).to_have_url(f"{base}/teams")
    expect(page.locator("#teams tr.empty")).to_have_count(1)
