"""Joins that wait for a starting swarm hold no database transaction, so the hub's other requests go on.

A join waits up to 10 s for the swarm's bootstrap peer to publish its addresses. It used to wait inside the
request's transaction, after authentication had written the token's last use: on SQLite every other write (a
sign-up, a report) then waited on that lock and failed after the busy timeout with a 500.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hivemind.utils.crypto import RSAPrivateKey

from ..conftest import PASSWORD, csrf_from
from ..processes import running_server, signup

pytestmark = [pytest.mark.e2e, pytest.mark.solo, pytest.mark.timeout(240)]  # see tests/lanes.py
SLUG = "busy-start"


def test_thirty_joins_waiting_for_a_starting_swarm_do_not_stall_pages_or_sign_ups(tmp_path):
    with running_server(tmp_path) as (url, _):
        owner = signup(url, "organizer")
        organizer = {"Authorization": f"Bearer {owner}"}
        created = httpx.post(
            f"{url}/api/experiments",
            headers=organizer,
            json={"slug": SLUG, "title": "Busy start", "task": "digits", "aux_peer": False},
        )
        assert created.status_code == 201, created.text
        # eight accounts (sign-ups are limited to ten an address), up to four peer keys each (the experiment's
        # default limit); the volunteers' tokens have not been used on the API yet (the first use writes)
        accounts = [owner, *(signup(url, f"vol{i}") for i in range(7))]
        keys = [RSAPrivateKey().get_public_key().to_bytes().decode() for _ in range(30)]

        def join(i: int) -> int:
            response = httpx.post(
                f"{url}/api/experiments/{SLUG}/join",
                headers={"Authorization": f"Bearer {accounts[i % 8]}"},
                json={"peer_public_key": keys[i]},
                timeout=60,
            )
            return response.status_code

        started = httpx.post(f"{url}/api/experiments/{SLUG}/status", headers=organizer, json={"action": "start"})
        assert started.json()["status"] == "running"
        with ThreadPoolExecutor(max_workers=30) as pool:
            joins = [pool.submit(join, i) for i in range(30)]
            time.sleep(1.0)  # the joins are waiting for the bootstrap peer now
            waiting = sum(not j.done() for j in joins)
            began = time.monotonic()
            page = httpx.get(f"{url}/", timeout=30)
            page_seconds = time.monotonic() - began
            with httpx.Client(base_url=url, timeout=30) as browser:  # a write while the joins wait
                token = csrf_from(browser.get("/signup").text)
                signed_up = browser.post(
                    "/signup", data={"username": "latecomer", "password": PASSWORD, "csrf_token": token}
                )
            statuses = [j.result() for j in joins]
    assert waiting > 0, "the swarm started before the joins arrived: nothing was measured"
    assert page.status_code == 200 and page_seconds < 1.0, page_seconds
    assert signed_up.status_code == 303, signed_up.text
    assert set(statuses) <= {200, 503}, statuses  # joined, or told to try again: never a 500
    assert statuses.count(200) > 0, statuses
