"""Hardening: security headers on every page, rate limits on log-in, sign-up, device-code entry and token
issue (429 with Retry-After, nothing created), and signing out everywhere."""

from __future__ import annotations

from sqlalchemy import func, select

from swarmhub.server.http.ratelimit import LIMITS
from swarmhub.server.models import User, WebSession

from .conftest import PASSWORD, csrf_from, make_user


def test_pages_carry_a_csp_without_inline_scripts(client):
    for path in ("/", "/login", "/signup", "/api/experiments"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp, path
        assert "frame-ancestors 'none'" in csp
        assert headers["x-content-type-options"] == "nosniff"


def test_login_attempts_are_limited_per_address(client, db):
    make_user(db)
    limit, _ = LIMITS["login"]
    for _ in range(limit):
        assert client.post("/api/auth/token", json={"username": "alice", "password": "wrong"}).status_code == 401
    refused = client.post("/api/auth/token", json={"username": "alice", "password": PASSWORD})
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) > 0 and "try again in" in refused.json()["detail"]
    # The page form shares the budget: a guesser cannot switch doors.
    csrf = csrf_from(client.get("/login").text)
    page = client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf})
    assert page.status_code == 429 and "try again in" in page.text


def test_signups_are_limited_and_a_refused_one_creates_nothing(client, db):
    limit, _ = LIMITS["signup"]
    for n in range(limit):
        csrf = csrf_from(client.get("/signup").text)
        client.post("/signup", data={"username": f"user{n}", "password": PASSWORD, "csrf_token": csrf})
        client.cookies.clear()
    csrf = csrf_from(client.get("/signup").text)
    refused = client.post("/signup", data={"username": "onemore", "password": PASSWORD, "csrf_token": csrf})
    assert refused.status_code == 429
    with db() as session:
        assert session.scalar(select(func.count(User.id))) == limit
        assert session.scalar(select(User.id).where(User.username == "onemore")) is None


def test_device_code_guessing_is_limited(client, db):
    make_user(db)
    csrf = csrf_from(client.get("/login").text)
    client.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf})
    limit, _ = LIMITS["device-entry"]
    statuses = [client.get("/device", params={"user_code": f"WXYZ-{n:04d}"}).status_code for n in range(limit + 1)]
    assert statuses[:limit] == [200] * limit and statuses[-1] == 429


def test_sign_out_everywhere_ends_every_browser_session(app, db):
    from starlette.testclient import TestClient

    make_user(db)
    with TestClient(app) as laptop, TestClient(app) as phone:
        for browser in (laptop, phone):
            csrf = csrf_from(browser.get("/login").text)
            browser.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf})
            assert browser.get("/account", follow_redirects=False).status_code == 200
        csrf = csrf_from(laptop.get("/account").text)
        done = laptop.post("/account/sign-out-everywhere", data={"csrf_token": csrf}, follow_redirects=False)
        assert done.status_code == 303 and done.headers["location"] == "/login"
        for browser in (laptop, phone):
            assert browser.get("/account", follow_redirects=False).status_code == 303  # to the login page
    with db() as session:
        assert session.scalar(select(func.count(WebSession.id))) == 0
