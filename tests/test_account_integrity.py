"""Accounts hold in the database itself, and a reset password locks out whoever held the old one."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from starlette.testclient import TestClient

from swarmhub.server.core import security
from swarmhub.server.core.settings import Settings
from swarmhub.server.models import User
from swarmhub.worker.cli.main import main

from .conftest import PASSWORD, api_token, csrf_from, make_user

pytestmark = pytest.mark.both_databases  # case-insensitive unique usernames are an expression index

NEW_PASSWORD = "a-new-long-password"


def test_usernames_that_differ_only_in_case_are_refused_by_the_database(db):
    make_user(db, "Ada")
    with pytest.raises(IntegrityError), db.begin() as session:  # as a second process signing up at once would
        session.add(User(username="ada", password_hash="x", is_admin=False))
    with db() as session:
        assert [u.username for u in session.query(User)] == ["Ada"]


def test_a_password_reset_through_admin_ends_every_session_and_token(app, client, db, settings, tmp_path):
    make_user(db, "root")
    make_user(db, "olga")
    token = api_token(client, "olga")
    with TestClient(app) as browser:
        csrf = csrf_from(browser.get("/login").text)
        browser.post("/login", data={"username": "olga", "password": PASSWORD, "csrf_token": csrf})
        assert browser.get("/account", follow_redirects=False).status_code == 200
        env = {"SWARMHUB_DATABASE_URL": settings.database_url, "SWARMHUB_DATA_DIR": str(tmp_path)}
        reset = CliRunner().invoke(main, ["admin", "OLGA", "--password-stdin"], env=env, input=NEW_PASSWORD + "\n")
        assert reset.exit_code == 0, reset.output
        assert "1 browser session(s) ended and 1 API token(s) revoked" in reset.output
        assert browser.get("/account", follow_redirects=False).status_code == 303  # to the log-in page
    assert client.get("/api/me", headers=token).status_code == 401
    assert client.post("/api/auth/token", json={"username": "olga", "password": PASSWORD}).status_code == 401
    assert client.post("/api/auth/token", json={"username": "olga", "password": NEW_PASSWORD}).status_code == 200


def test_the_least_cost_password_hashing_is_refused_outside_test_suites(monkeypatch):
    monkeypatch.setenv("SWARMHUB_PASSWORD_HASHING", "minimal")
    for environment in ("development", "production"):
        with pytest.raises(ValidationError, match="SWARMHUB_ENVIRONMENT=test only"):
            Settings(environment=environment, cookie_secure=True)
    assert Settings(environment="test").password_hashing == "minimal"


def test_a_password_hashed_under_either_cost_verifies_under_the_other():
    """Stored hashes carry their own parameters: accounts made before a change of setting still log in."""
    try:
        security.use_password_hashing("standard")
        standard = security.hash_password(PASSWORD)
        security.use_password_hashing("minimal")
        minimal = security.hash_password(PASSWORD)
        assert security.verify_password(standard, PASSWORD) and not security.verify_password(standard, "wrong")
        security.use_password_hashing("standard")
        assert security.verify_password(minimal, PASSWORD) and not security.verify_password(minimal, "wrong")
        assert "m=8,t=1,p=1" in minimal and "m=8,t=1,p=1" not in standard
    finally:
        security.use_password_hashing("minimal")  # what the suite's apps use
