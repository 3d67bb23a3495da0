"""Every state-changing page route refuses a form without this session's CSRF token (403) and changes nothing.

The routes come from the pages' router itself, so a form added later is covered without touching this file."""

from __future__ import annotations

import re
from typing import Any

from fastapi.routing import APIRoute
from sqlalchemy import select
from starlette.testclient import TestClient

from swarmhub.server.models import ApiToken, Base, Experiment
from swarmhub.server.routes import pages

from .conftest import PASSWORD, api_token, csrf_from, login, make_experiment, make_user

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
REFUSAL = "the form expired or came from another site"


def page_routes() -> list[tuple[str, str]]:
    """(method, path) of every state-changing route of the pages' router (the app includes it unprefixed)."""
    found = []
    for route in pages.router.routes:
        if isinstance(route, APIRoute):
            found += [(method, route.path) for method in sorted(route.methods & STATE_CHANGING)]
    return found


def snapshot(db: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to show that a refused form changed nothing."""
    with db() as session:
        return {
            table.name: sorted((tuple(row) for row in session.execute(select(table))), key=repr)
            for table in Base.metadata.sorted_tables
        }


def test_every_form_without_a_valid_csrf_token_is_refused_and_changes_nothing(app, client, db):
    alice = make_user(db, "alice")  # the first user: administrator, and the organizer of "target"
    make_user(db, "vera")
    make_experiment(db, alice, slug="target", status="running")
    api_token(client, "alice")
    with db() as session:
        token_id = session.scalar(select(ApiToken.id))
    device = client.post("/api/auth/device/code", json={"client_name": "a laptop"}).json()
    with db() as session:
        invite_code = session.scalar(select(Experiment.invite_code).where(Experiment.slug == "target"))
    # A team named like the experiment, founded by alice, which vera is in: the team forms act on it.
    client.post("/api/teams", json={"name": "target"}, headers=api_token(client, "alice"))
    client.post("/api/teams/target/join", headers=api_token(client, "vera"))
    path_values = {"slug": "target", "token_id": str(token_id), "code": invite_code, "username": "vera"}
    # One form with the fields the routes read: with the session's token, most of them change something with it.
    form = {
        "username": "vera",
        "password": PASSWORD,
        "title": "Taken over",
        "slug": "taken-over",
        "task": "digits",
        "target_batch_size": "128",
        "action": "pause",
        "name": "stolen",
        "user_code": device["user_code"],
        "decision": "approve",
        "profile_hidden": "on",
    }
    other_session = TestClient(app)
    someone_elses = login(other_session, "vera")

    routes = page_routes()
    assert ("POST", "/login") in routes and ("POST", "/experiments/{slug}/status") in routes
    assert ("POST", "/teams/{slug}/members/{username}/remove") in routes
    for method, template in routes:
        names = re.findall(r"{(\w+)(?::\w+)?}", template)
        missing = [name for name in names if name not in path_values]
        assert not missing, f"{method} {template}: add a value for {missing} to path_values"
        path = re.sub(r"{(\w+)(?::\w+)?}", lambda m: path_values[m.group(1)], template)

        signed_in, anonymous = TestClient(app), TestClient(app)
        csrf = login(signed_in, "alice")
        csrf_from(anonymous.get("/login").text)  # a visitor holds the pre-login CSRF cookie
        attempts = {
            "signed in, no token": (signed_in, {}),
            "signed in, empty token": (signed_in, {"csrf_token": ""}),
            "signed in, forged token": (signed_in, {"csrf_token": "forged"}),
            "signed in, another session's token": (signed_in, {"csrf_token": someone_elses}),
            "signed out, no token": (anonymous, {}),
            "signed out, forged token": (anonymous, {"csrf_token": "forged"}),
        }
        before = snapshot(db)
        for what, (browser, extra) in attempts.items():
            response = browser.request(method, path, data={**form, **extra}, follow_redirects=False)
            assert response.status_code == 403, f"{method} {path}, {what}: {response.status_code}"
            assert REFUSAL in response.text, f"{method} {path}, {what}"
        assert snapshot(db) == before, f"{method} {path} changed the database without a valid CSRF token"

        # The same form with the session's own token gets past the check: the token was what was missing.
        accepted = signed_in.request(method, path, data={**form, "csrf_token": csrf}, follow_redirects=False)
        assert accepted.status_code != 403, f"{method} {path} refused a valid token: {accepted.text[:300]}"
