"""Real Chromium for the browser tests: Debian's, driven by Playwright (Playwright's own browser download is not
used). ``SWARMHUB_CHROMIUM`` names another binary."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from playwright.sync_api import sync_playwright

CHROMIUM = os.environ.get("SWARMHUB_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def page() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make setup-browser`")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context(viewport={"width": 1200, "height": 1400})
        yield context.new_page()
        browser.close()


def browser_app(tmp_path: Path) -> FastAPI:
    """The app the browser tests serve: a fresh SQLite database in ``tmp_path``, no swarm processes."""
    from swarmhub.server.app import create_app
    from swarmhub.server.core.settings import Settings

    database = f"sqlite:///{tmp_path / 'browser.db'}"
    return create_app(
        Settings(environment="test", data_dir=tmp_path / "data", database_url=database, swarm_enabled=False)
    )


def sign_up(page: Any, base: str, username: str) -> None:
    """Sign ``username`` up through the real form; the page is then signed in (the header names the account)."""
    from playwright.sync_api import expect

    from ..conftest import PASSWORD

    page.goto(f"{base}/signup")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    expect(page.locator("header nav")).to_contain_text(username)


def shown(number: float, digits: int) -> str:
    """``number`` as dashboard.js's ``fmt`` writes it in Chromium's default locale: at most ``digits`` decimals,
    no trailing zeros."""
    text = f"{number:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text
