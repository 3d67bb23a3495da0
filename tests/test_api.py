"""The JSON API, through FastAPI's TestClient, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64

from hivemind.utils.crypto import RSAPrivateKey
from sqlalchemy import func, select

from swarmhub.common.protocol import JoinResponse
from swarmhub.server import experiments
from swarmhub.server.models import Experiment
from swarmhub.worker.swarm import access as swarm_access

from .conftest import api_token, csrf_from, login, make_experiment, make_user

PEER_KEY = swarm_access.public_key_text(RSAPrivateKey())
NEW = {"slug": "mnist-ish", "title": "Digits", "task": "digits", "task_params": {"hidden_size": 32}}


def count_experiments(db) -> int:
    with db() as session:
        return session.scalar(select(func.count(Experiment.id)))


def test_create_and_read_experiment(client, db):
    make_user(db)
    headers = api_token(client)
    response = client.post("/api/experiments", json=NEW, headers=headers)
    assert response.status_code == 201
    body = response.json()
    assert body["status"] == "draft"
    assert body["owner"] == "alice"
    assert body["task_params"] == {"hidden_size": 32, "batch_size": 32}  # task defaults filled in
    assert client.get("/api/experiments/mnist-ish", headers=headers).json()["title"] == "Digits"


def test_invalid_experiment_names_the_field_and_creates_nothing(client, db):
    make_user(db)
    headers = api_token(client)
    cases = {
        "slug": {**NEW, "slug": "Not A Slug"},
        "learning_rate": {**NEW, "learning_rate": 0},
        "target_batch_size": {**NEW, "target_batch_size": "many"},
        "task": {**NEW, "task": "imagenet"},
        "task_params": {**NEW, "task_params": {"hidden_size": 1}},
        "averaging_timeout": {**NEW, "averaging_timeout": 1},
        "group_size": {**NEW, "group_size": 1},  # a group of one averages with no one
    }
    for field, body in cases.items():
        response = client.post("/api/experiments", json=body, headers=headers)
        assert response.status_code == 422, field
        assert [err["loc"] for err in response.json()["detail"]] == [["body", field]]
    assert count_experiments(db) == 0


def test_task_param_error_says_which_parameter(client, db):
    make_user(db)
    response = client.post(
        "/api/experiments", json={**NEW, "task_params": {"hidden_size": 1}}, headers=api_token(client)
    )
    assert "hidden_size" in response.json()["detail"][0]["msg"]


def test_error_shape_is_pinned(client, db):
    make_user(db)
    headers = api_token(client)
    client.post("/api/experiments", json=NEW, headers=headers)
    response = client.post("/api/experiments", json=NEW, headers=headers)
    assert response.status_code == 409
    assert response.json() == {"detail": "the slug 'mnist-ish' is taken", "field": "slug"}
    assert count_experiments(db) == 1


def test_writes_need_a_valid_token(client, db):
    assert client.post("/api/experiments", json=NEW).status_code == 401
    bad = client.post("/api/experiments", json=NEW, headers={"Authorization": "Bearer shb_nope"})
    assert bad.status_code == 401
    assert "swarmhub login" in bad.json()["detail"]


def test_status_lifecycle(client, db):
    make_user(db)
    headers = api_token(client)
    client.post("/api/experiments", json=NEW, headers=headers)

    def act(action):
        return client.post(f"/api/experiments/{NEW['slug']}/status", json={"action": action}, headers=headers)

    assert act("pause").status_code == 409  # a draft is not running
    assert act("start").json()["status"] == "running"
    assert act("pause").json()["status"] == "paused"
    assert act("start").json()["status"] == "running"
    assert act("finish").json()["status"] == "finished"
    refused = act("start")
    assert refused.status_code == 409
    assert refused.json()["detail"] == "cannot start an experiment that is finished"
    assert act("explode").status_code == 422


def test_edit_rules(client, db):
    make_user(db)
    headers = api_token(client)
    client.post("/api/experiments", json=NEW, headers=headers)
    url = f"/api/experiments/{NEW['slug']}"
    assert client.patch(url, json={"learning_rate": 0.01}, headers=headers).json()["learning_rate"] == 0.01
    client.post(f"{url}/status", json={"action": "start"}, headers=headers)
    running_edit = client.patch(url, json={"learning_rate": 0.5}, headers=headers)
    assert running_edit.status_code == 409
    assert running_edit.json()["field"] == "learning_rate"
    assert client.patch(url, json={"title": "Renamed"}, headers=headers).json()["title"] == "Renamed"
    bad = client.patch(url, json={"title": ""}, headers=headers)
    assert bad.status_code == 422
    assert bad.json()["detail"][0]["loc"] == ["body", "title"]
    client.post(f"{url}/status", json={"action": "pause"}, headers=headers)
    bad_params = client.patch(url, json={"task_params": {"hidden_size": 1}}, headers=headers)
    assert bad_params.status_code == 422
    assert bad_params.json()["detail"][0]["loc"] == ["body", "task_params"]
    assert client.get(url).json()["title"] == "Renamed"
    assert client.get(url).json()["task_params"]["hidden_size"] == 32


def test_only_the_owner_changes_an_experiment(client, db):
    owner = make_user(db)
    make_user(db, "mallory")
    make_experiment(db, owner, slug="owned", status="running")
    headers = api_token(client, "mallory")
    assert client.patch("/api/experiments/owned", json={"title": "mine"}, headers=headers).status_code == 403
    forbidden = client.post("/api/experiments/owned/status", json={"action": "finish"}, headers=headers)
    assert forbidden.status_code == 403
    assert client.get("/api/experiments/owned").json()["status"] == "running"


def test_admin_manages_any_experiment(client, db):
    owner = make_user(db, "alice", is_admin=False)
    make_user(db, "root", is_admin=True)
    make_experiment(db, owner, slug="owned", status="running")
    response = client.post("/api/experiments/owned/status", json={"action": "pause"}, headers=api_token(client, "root"))
    assert response.json()["status"] == "paused"


def test_drafts_are_private(client, db):
    owner = make_user(db)
    make_user(db, "bob")
    make_experiment(db, owner, slug="secret")
    make_experiment(db, owner, slug="public", status="running")
    assert [e["slug"] for e in client.get("/api/experiments").json()] == ["public"]
    assert client.get("/api/experiments/secret").status_code == 404
    assert client.get("/api/experiments/secret", headers=api_token(client, "bob")).status_code == 404
    mine = client.get("/api/experiments", headers=api_token(client)).json()
    assert sorted(e["slug"] for e in mine) == ["public", "secret"]


def test_first_user_is_admin(client, db):
    first = make_user(db)
    second = make_user(db, "bob")
    assert (first.is_admin, second.is_admin) == (True, False)
    assert client.get("/api/me", headers=api_token(client)).json() == {
        "username": "alice",
        "is_admin": True,
        "scope": "organizer",
        "expires_at": None,
    }


def test_join_refuses_unknown_and_stopped_experiments(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="paused-one", status="paused")
    headers = api_token(client)
    body = {"peer_public_key": PEER_KEY}
    unknown = client.post("/api/experiments/nope/join", json=body, headers=headers)
    assert unknown.status_code == 404
    paused = client.post("/api/experiments/paused-one/join", json=body, headers=headers)
    assert paused.status_code == 409
    assert "not accepting volunteers" in paused.json()["detail"]
    assert client.post("/api/experiments/paused-one/join", json=body).status_code == 401
    refresh = client.post("/api/experiments/paused-one/swarm-token", json=body, headers=headers)
    assert refresh.status_code == 409


def test_join_needs_a_peer_key(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="open", status="running")
    headers = api_token(client)
    missing = client.post("/api/experiments/open/join", json={}, headers=headers)
    assert [err["loc"] for err in missing.json()["detail"]] == [["body", "peer_public_key"]]
    garbage = client.post(
        "/api/experiments/open/join", json={"peer_public_key": "ssh-rsa " + "A" * 80}, headers=headers
    )
    assert garbage.status_code == 400
    assert garbage.json()["field"] == "peer_public_key"


def test_swarm_token_refresh_is_signed_by_the_experiment(client, db):
    owner = make_user(db)
    make_experiment(db, owner, slug="open", status="running")
    response = client.post(
        "/api/experiments/open/swarm-token", json={"peer_public_key": PEER_KEY}, headers=api_token(client)
    )
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"  # it carries a token
    token = swarm_access.token_from_wire(response.json())
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "open"))
        key = swarm_access.signing_key_from_text(experiment.signing_key).get_public_key()
        run_id = experiments.run_id(experiment)
    assert token.username == "alice" and token.public_key.decode() == PEER_KEY
    assert swarm_access.verify_token(token, key, run_id)
    assert not swarm_access.verify_token(token, key, run_id + "-other")
    assert "signing_key" not in client.get("/api/experiments/open").text


def test_the_experiment_signing_key_never_leaves_the_server(client, db):
    """Workers get tokens signed by the experiment's key; nothing they, the organizer or the public can fetch
    carries the private key."""
    owner = make_user(db)
    make_experiment(db, owner, slug="open", status="running")
    with db() as session:
        experiment = session.scalar(select(Experiment).where(Experiment.slug == "open"))
        secret, run_id = experiment.signing_key, experiments.run_id(experiment)
    der = base64.b64decode(secret)
    pieces = [secret, secret[len(secret) // 2 : len(secret) // 2 + 40], der.hex()[:80]]
    organizer, body = api_token(client), {"peer_public_key": PEER_KEY}
    login(client)
    fetched = {
        "refresh": client.post("/api/experiments/open/swarm-token", json=body, headers=organizer),
        "experiment": client.get("/api/experiments/open", headers=organizer),
        "metrics": client.get("/api/experiments/open/metrics", headers=organizer),
        "dashboard": client.get("/experiments/open"),
        "edit page": client.get("/experiments/open/edit"),
    }
    for what, response in fetched.items():
        assert response.status_code == 200, (what, response.status_code)
        assert not any(piece in response.text for piece in pieces), f"the {what} response carries the signing key"
    # What a worker is sent besides its token (the join response, the e2e tests' subject) has no field for a key
    # other than the public one.
    assert {name for name in JoinResponse.model_fields if "key" in name} == {"experiment_public_key"}
    token = swarm_access.token_from_wire(fetched["refresh"].json())
    assert swarm_access.verify_token(token, swarm_access.signing_key_from_text(secret).get_public_key(), run_id)


def test_revoked_token_stops_working(client, db):
    make_user(db)
    headers = api_token(client)
    assert client.get("/api/me", headers=headers).status_code == 200
    assert client.delete("/api/auth/token", headers=headers).status_code == 204
    assert client.get("/api/me", headers=headers).status_code == 401


def test_wrong_password_says_so(client, db):
    make_user(db)
    response = client.post("/api/auth/token", json={"username": "alice", "password": "wrong-password"})
    assert response.status_code == 401
    assert response.json() == {"detail": "wrong username or password", "field": "password"}


def test_healthz_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/api/experiments", "/api/experiments/{slug}/join", "/api/experiments/{slug}/leaderboard"} <= set(paths)


def test_organizer_removes_a_volunteer(client, db):
    owner = make_user(db)
    make_user(db, "bob")
    make_user(db, "mallory")
    make_experiment(db, owner, slug="open", status="running")
    organizer, bob = api_token(client), api_token(client, "bob")
    body = {"peer_public_key": PEER_KEY}
    assert client.post("/api/experiments/open/swarm-token", json=body, headers=bob).status_code == 200

    assert (
        client.post(
            "/api/experiments/open/bans", json={"username": "bob"}, headers=api_token(client, "mallory")
        ).status_code
        == 403
    )
    assert client.post("/api/experiments/open/bans", json={"username": "nobody"}, headers=organizer).status_code == 404
    assert client.post("/api/experiments/open/bans", json={"username": "bob"}, headers=organizer).status_code == 204

    refused = client.post("/api/experiments/open/swarm-token", json=body, headers=bob)
    assert refused.status_code == 403
    assert refused.json()["detail"] == "you were removed from 'open' by its organizer"
    assert client.post("/api/experiments/open/join", json=body, headers=bob).status_code == 403
    assert client.get("/api/experiments/open/denylist", headers=bob).json() == {"usernames": ["bob"]}

    assert client.delete("/api/experiments/open/bans/bob", headers=organizer).status_code == 204
    assert client.get("/api/experiments/open/denylist", headers=bob).json() == {"usernames": []}
    assert client.post("/api/experiments/open/swarm-token", json=body, headers=bob).status_code == 200


def test_join_policies(client, db):
    make_user(db)
    for name in ("bob", "carol"):
        make_user(db, name)
    organizer, bob, carol = api_token(client), api_token(client, "bob"), api_token(client, "carol")
    client.post("/api/experiments", json={**NEW, "join_policy": "allowlist", "allowlist": ["bob"]}, headers=organizer)
    client.post(f"/api/experiments/{NEW['slug']}/status", json={"action": "start"}, headers=organizer)
    url = f"/api/experiments/{NEW['slug']}/swarm-token"
    body = {"peer_public_key": PEER_KEY}
    own_key = {"peer_public_key": swarm_access.public_key_text(RSAPrivateKey())}  # a key is one volunteer's
    assert client.post(url, json=body, headers=bob).status_code == 200
    listed_only = client.post(url, json=body, headers=carol)
    assert listed_only.status_code == 403 and "listed" in listed_only.json()["detail"]
    assert client.post(url, json=own_key, headers=organizer).status_code == 200  # the organizer always may

    client.patch(f"/api/experiments/{NEW['slug']}", json={"join_policy": "invite"}, headers=organizer)
    invited_only = client.post(url, json=body, headers=carol)
    assert invited_only.status_code == 403 and "invite link" in invited_only.json()["detail"]
    with db() as session:
        code = session.scalar(select(Experiment.invite_code))
    login(client, "carol")
    assert client.get(f"/experiments/{NEW['slug']}/invite/wrong-code").status_code == 404
    invite = f"/experiments/{NEW['slug']}/invite/{code}"
    # Opening the link only asks: a link followed from another site makes no one a volunteer.
    asked = client.get(invite)
    assert asked.status_code == 200 and 'method="post"' in asked.text
    assert client.post(url, json=body, headers=carol).status_code == 403
    accepted = client.post(invite, data={"csrf_token": csrf_from(asked.text)}, follow_redirects=False)
    assert accepted.status_code == 303
    assert client.get(invite, follow_redirects=False).headers["location"] == f"/experiments/{NEW['slug']}"
    carols_key = {"peer_public_key": swarm_access.public_key_text(RSAPrivateKey())}
    assert client.post(url, json=carols_key, headers=carol).status_code == 200
    assert client.post(url, json=body, headers=bob).status_code == 403  # the allow-list no longer applies

    bad = client.patch(f"/api/experiments/{NEW['slug']}", json={"allowlist": ["ok", "not a name!"]}, headers=organizer)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "allowlist"]


def test_overlap_and_auxiliary_peer_settings(client, db):
    make_user(db)
    headers = api_token(client)
    created = client.post(
        "/api/experiments", json={**NEW, "overlap": "delayed-averaging", "aux_peer": True}, headers=headers
    )
    assert created.status_code == 201, created.text
    url = f"/api/experiments/{NEW['slug']}"
    assert (created.json()["overlap"], created.json()["aux_peer"]) == ("delayed-averaging", True)
    bad = client.patch(url, json={"overlap": "sometimes"}, headers=headers)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "overlap"]
    client.post(f"{url}/status", json={"action": "start"}, headers=headers)
    # Every peer must agree on the overlap: not while running. The server's auxiliary peer can come and go.
    assert client.patch(url, json={"overlap": "none"}, headers=headers).json()["field"] == "overlap"
    assert client.patch(url, json={"aux_peer": False}, headers=headers).json()["aux_peer"] is False
    assert client.get(url).json()["overlap"] == "delayed-averaging"
