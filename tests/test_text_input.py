"""Text the database cannot store: a NUL character in any field that is stored or looked up is refused with a
4xx that names the field (a 422 from the API, the form again with the error inline), and nothing is written.
PostgreSQL text cannot hold a NUL at all (it was a 500 there), so every case runs on both databases."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select
from starlette.testclient import WebSocketDenialResponse

from swarmhub.server.models import ApiToken, DeviceAuthorization, Experiment, ExperimentBan, User, WorkerRun

from .conftest import PASSWORD, api_token, csrf_from, login, make_experiment, make_user

NUL = "bad\x00name"
PEER_KEY = "ssh-rsa " + "A" * 80


def count(db, model) -> int:
    with db() as session:
        return session.scalar(select(func.count()).select_from(model))


def assert_names(response, field: str) -> None:
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][-1] == field and "NUL" in error["msg"], error


@pytest.fixture
def organizer(client, db):
    """alice, signed in over the API, with a running experiment; bob is a volunteer."""
    alice = make_user(db)
    make_user(db, "bob")
    make_experiment(db, alice, slug="digits-run", status="running", description="as it was")
    return api_token(client)


def test_token_login_refuses_a_nul_in_username_or_token_name(client, db):
    make_user(db)
    tokens = count(db, ApiToken)
    assert_names(client.post("/api/auth/token", json={"username": NUL, "password": PASSWORD}), "username")
    body = {"username": "alice", "password": PASSWORD, "token_name": NUL}
    assert_names(client.post("/api/auth/token", json=body), "token_name")
    assert count(db, ApiToken) == tokens


def test_device_code_refuses_a_nul_client_name(client, db):
    assert_names(client.post("/api/auth/device/code", json={"client_name": NUL}), "client_name")
    assert count(db, DeviceAuthorization) == 0


@pytest.mark.parametrize("field", ["title", "description", "slug", "allowlist"])
def test_creating_an_experiment_refuses_a_nul(client, db, field):
    make_user(db)
    body = {"slug": "nul-test", "title": "NUL test", field: [NUL] if field == "allowlist" else NUL}
    response = client.post("/api/experiments", json=body, headers=api_token(client))
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"][1] == field
    assert count(db, Experiment) == 0


@pytest.mark.parametrize("field", ["title", "description"])
def test_editing_an_experiment_refuses_a_nul(client, db, organizer, field):
    client.post("/api/experiments/digits-run/status", json={"action": "pause"}, headers=organizer)
    response = client.patch("/api/experiments/digits-run", json={field: NUL}, headers=organizer)
    assert_names(response, field)
    with db() as session:
        experiment = session.scalar(select(Experiment))
        assert (experiment.title, experiment.description) == ("Experiment digits-run", "as it was")


def test_bans_refuse_a_nul_username(client, db, organizer):
    assert_names(client.post("/api/experiments/digits-run/bans", json={"username": NUL}, headers=organizer), "username")
    assert_names(client.delete("/api/experiments/digits-run/bans/bad%00name", headers=organizer), "username")
    assert count(db, ExperimentBan) == 0


def test_join_refuses_a_nul_device(client, db, organizer):
    body = {"device": NUL, "peer_public_key": PEER_KEY}
    assert_names(client.post("/api/experiments/digits-run/join", json=body, headers=organizer), "device")
    body = {"client_version": NUL, "peer_public_key": PEER_KEY}
    assert_names(client.post("/api/experiments/digits-run/join", json=body, headers=organizer), "client_version")
    assert count(db, WorkerRun) == 0


@pytest.mark.parametrize("path", ["", "/leaderboard", "/metrics", "/denylist"])
def test_a_slug_with_a_nul_names_no_experiment(client, organizer, path):
    response = client.get(f"/api/experiments/digits-run%00{path}", headers=organizer)
    assert response.status_code == 404 and "no experiment" in response.json()["detail"]


def test_report_socket_refuses_a_nul_worker_id(client, organizer):
    with pytest.raises(WebSocketDenialResponse) as denied:
        with client.websocket_connect("/ws/experiments/digits-run/report?worker_id=a%00b", headers=organizer):
            pass
    assert denied.value.status_code == 403


# The pages: the form comes back with the error next to the field, and nothing is stored.


def test_signup_form_refuses_a_nul_username(client, db):
    csrf = csrf_from(client.get("/signup").text)
    response = client.post("/signup", data={"username": NUL, "password": PASSWORD, "csrf_token": csrf})
    assert response.status_code == 422 and 'id="error-username"' in response.text
    assert count(db, User) == 0


def test_login_form_refuses_a_nul_username(client, db):
    make_user(db)
    csrf = csrf_from(client.get("/login").text)
    response = client.post("/login", data={"username": NUL, "password": PASSWORD, "csrf_token": csrf})
    assert response.status_code == 422
    assert 'id="error-username"' in response.text and "NUL" in response.text
    assert "swarmhub_session" not in response.cookies


def test_token_form_refuses_a_nul_name(client, db):
    make_user(db)
    csrf = login(client)
    response = client.post("/account/tokens", data={"name": NUL, "csrf_token": csrf})
    assert response.status_code == 422
    assert 'id="error-name"' in response.text and 'id="new-token"' not in response.text
    assert count(db, ApiToken) == 0


@pytest.mark.parametrize("field", ["title", "description"])
def test_experiment_form_refuses_a_nul(client, db, field):
    make_user(db)
    csrf = login(client)
    form = {"csrf_token": csrf, "slug": "nul-form", "title": "NUL form", "task": "digits", field: NUL}
    response = client.post("/experiments/new", data=form)
    assert response.status_code == 422 and f'id="error-{field}"' in response.text
    assert count(db, Experiment) == 0


def test_edit_form_refuses_a_nul(client, db):
    make_experiment(db, make_user(db), slug="digits-run", description="as it was")
    csrf = login(client)
    form = {"csrf_token": csrf, "title": "Still fine", "description": NUL, "task": "digits"}
    response = client.post("/experiments/digits-run/edit", data=form)
    assert response.status_code == 422 and 'id="error-description"' in response.text
    with db() as session:
        experiment = session.scalar(select(Experiment))
        assert (experiment.title, experiment.description) == ("Experiment digits-run", "as it was")


def test_ban_form_with_a_nul_names_no_volunteer(client, db):
    make_experiment(db, make_user(db), slug="digits-run", status="running")
    csrf = login(client)
    response = client.post("/experiments/digits-run/bans", data={"csrf_token": csrf, "username": NUL})
    assert response.status_code == 404 and "no user" in response.text
    assert count(db, ExperimentBan) == 0


def test_device_form_with_a_nul_code_finds_no_grant(client, db):
    make_user(db)
    csrf = login(client)
    response = client.post("/device", data={"csrf_token": csrf, "user_code": "ABCD\x00EFGH", "decision": "approve"})
    assert response.status_code == 404 and "unknown or has expired" in response.text
    assert client.get("/device", params={"user_code": "ABCD\x00EFGH"}).status_code == 200


def test_a_slug_with_a_nul_names_no_page(client, db):
    make_experiment(db, make_user(db), slug="digits-run", status="running")
    login(client)
    assert client.get("/experiments/digits-run%00").status_code == 404
    assert client.get("/experiments/digits-run%00/invite/code").status_code == 404


def test_non_ascii_secrets_are_refused_not_crashed_on(client, db):
    """compare_digest refuses non-ASCII str: an invite code or a CSRF token with one must be a 4xx."""
    make_experiment(db, make_user(db), slug="digits-run", status="running")
    login(client)
    assert client.get("/experiments/digits-run/invite/caf%C3%A9").status_code == 404
    response = client.post("/account/tokens", data={"csrf_token": "café", "name": "laptop"})
    assert response.status_code == 403
    assert count(db, ApiToken) == 0
