"""In real Chromium: the experiment form proposes the task's target batch size and timings, follows the task, its
parameters and the peers planned until the organizer types their own values, and warns when typed values cap the
swarm below one reference peer."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from ..conftest import LiveServer
from .conftest import browser_app, sign_up

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120)]


def test_the_form_proposes_settings_that_keep_the_planned_swarm_unthrottled(page, tmp_path):
    with LiveServer(browser_app(tmp_path)) as server:
        base = server.url
        sign_up(page, base, "organizer")

        def proposal(task: str, **params: object) -> dict:
            answer = page.request.get(f"{base}/api/tasks/{task}/proposal", params=params)
            assert answer.ok, answer.text()
            return answer.json()

        target, matchmaking = (
            page.locator("input[name=target_batch_size]"),
            page.locator("input[name=matchmaking_time]"),
        )
        timeout = page.locator("input[name=averaging_timeout]")
        warning = page.locator("#rate-cap-warning")

        page.goto(f"{base}/experiments/new")
        digits = proposal("digits")
        expect(target).to_have_value(str(digits["target_batch_size"]))  # rendered by the server, before any script
        expect(page.locator("#proposal-text")).to_contain_text(f"keep {digits['unthrottled_peers']:.1f} such peers")
        expect(warning).to_be_hidden()

        # another task: its own proposal, timings included
        page.select_option("#task-select", "albert-mlm")
        albert = proposal("albert-mlm")
        expect(target).to_have_value(str(albert["target_batch_size"]))
        expect(matchmaking).to_have_value("5")
        expect(timeout).to_have_value("60")
        # and its optimizer and learning rate, measured for its batch (the form's defaults are digits' Adam)
        assert albert["optimizer"] == "lamb" and albert["learning_rate"] is not None
        expect(page.locator("select[name=optimizer]")).to_have_value("lamb")
        expect(page.locator("input[name=learning_rate]")).to_have_value(str(albert["learning_rate"]))
        expect(page.locator("#proposal-text")).to_contain_text(f"lamb at a learning rate of {albert['learning_rate']}")
        # a smaller model is faster, and 300 planned peers need a larger batch
        page.select_option("select[name='param.albert-mlm.size']", "tiny")
        page.fill("#planned-peers", "300")
        tiny = proposal("albert-mlm", size="tiny", planned_peers=300)
        expect(target).to_have_value(str(tiny["target_batch_size"]))
        assert tiny["target_batch_size"] > albert["target_batch_size"]
        expect(page.locator("#rate-cap-value")).to_have_text(f"{tiny['rate_cap']:,.0f}")

        # the organizer's own value stands, and a cap below one reference peer is pointed out as it is typed
        page.fill("input[name=target_batch_size]", "100")
        expect(warning).to_be_visible()
        expect(warning).to_contain_text("cap the whole swarm at 20 samples/s")
        page.fill("#planned-peers", "2")
        page.wait_for_timeout(500)  # the proposal for 2 peers has come back; it no longer replaces typed values
        expect(target).to_have_value("100")
        page.click("#use-proposal")
        expect(target).to_have_value(str(proposal("albert-mlm", size="tiny", planned_peers=2)["target_batch_size"]))
        expect(warning).to_be_hidden()

        # what is created is what the form showed
        page.fill("input[name=title]", "Proposed")
        page.fill("input[name=slug]", "proposed")
        page.click("#experiment-form button[type=submit]")
        expect(page).to_have_url(f"{base}/experiments/proposed")
        created = page.request.get(f"{base}/api/experiments/proposed").json()
        assert (created["task"], created["task_params"]["size"]) == ("albert-mlm", "tiny")
        final = proposal("albert-mlm", size="tiny", planned_peers=2)
        assert (created["target_batch_size"], created["matchmaking_time"], created["averaging_timeout"]) == (
            final["target_batch_size"], 5.0, 60.0
        )  # fmt: skip
        assert (created["optimizer"], created["learning_rate"]) == (final["optimizer"], final["learning_rate"])
