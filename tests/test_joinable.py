"""GET /api/me/joinable: the running experiments a volunteer may join, most needed first (fewer peers online), as
`swarmhub join --any` chooses. Never one the join would refuse: a private experiment the volunteer is not a member
of, one they were removed from, a draft, paused or finished one."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hivemind.utils.crypto import RSAPrivateKey
from sqlalchemy import update

from swarmhub.server import experiments
from swarmhub.server.metrics.common import current_time
from swarmhub.server.models import SwarmPeerKey

from .conftest import api_token, make_experiment, make_user

pytestmark = pytest.mark.both_databases
PEER_KEY = RSAPrivateKey().get_public_key().to_bytes().decode()


def online(db, user, slug: str, *, rate: float = 10.0, seconds_ago: float = 0.0) -> None:
    """A worker run of ``user`` in ``slug`` that last reported ``seconds_ago``."""
    with db.begin() as session:
        experiment = experiments.get_visible(session, slug, None)
        run = experiments.start_worker_run(session, experiment, session.merge(user), "cpu")
        run.last_seen_at = current_time() - timedelta(seconds=seconds_ago)
        run.samples_per_second = rate


def slugs(client, username: str) -> list[str]:
    response = client.get("/api/me/joinable", headers=api_token(client, username))
    assert response.status_code == 200, response.text
    return [item["slug"] for item in response.json()]


def test_the_experiment_with_fewer_peers_online_comes_first_with_its_figures(client, db):
    olga = make_user(db, "olga")
    make_user(db, "vera")
    peers = [make_user(db, name) for name in ("pia", "paul")]
    for slug in ("crowded", "quiet", "busy"):
        make_experiment(db, olga, slug=slug, status="running")
    online(db, peers[0], "crowded", rate=20.0)
    online(db, peers[0], "crowded", rate=5.0)  # a second machine of the same volunteer: a second peer
    online(db, peers[1], "crowded", rate=10.0)
    online(db, peers[1], "busy", rate=50.0)
    online(db, peers[0], "quiet", seconds_ago=120)  # gone quiet: beyond the active window, not online
    online(db, peers[1], "busy", rate=1.0, seconds_ago=120)

    response = client.get("/api/me/joinable", headers=api_token(client, "vera"))
    assert response.status_code == 200
    assert response.json() == [
        {
            "slug": "quiet",
            "title": "Experiment quiet",
            "task": "digits",
            "peers_online": 0,
            "volunteers_online": 0,
            "samples_per_second": 0.0,
            "need": 1.0,
        },
        {
            "slug": "busy",
            "title": "Experiment busy",
            "task": "digits",
            "peers_online": 1,
            "volunteers_online": 1,
            "samples_per_second": 50.0,
            "need": 0.5,
        },
        {
            "slug": "crowded",
            "title": "Experiment crowded",
            "task": "digits",
            "peers_online": 3,
            "volunteers_online": 2,
            "samples_per_second": 35.0,
            "need": 0.25,
        },
    ]


def test_ties_go_to_less_throughput_then_to_the_name(client, db):
    olga, pia = make_user(db, "olga"), make_user(db, "pia")
    make_user(db, "vera")
    for slug in ("bravo", "alpha", "charlie"):
        make_experiment(db, olga, slug=slug, status="running")
    online(db, pia, "alpha", rate=30.0)
    online(db, pia, "bravo", rate=30.0)
    online(db, pia, "charlie", rate=10.0)
    assert slugs(client, "vera") == ["charlie", "alpha", "bravo"]


def test_only_what_the_join_would_accept_is_offered(client, db):
    olga, vera = make_user(db, "olga"), make_user(db, "vera")
    make_experiment(db, olga, slug="open-run", status="running")
    private = make_experiment(db, olga, slug="private-run", status="running", join_policy="invite")
    make_experiment(db, olga, slug="listed-run", status="running", join_policy="allowlist", allowlist=["olga"])
    make_experiment(db, olga, slug="banned-run", status="running")
    for slug, status in (("draft-run", "draft"), ("paused-run", "paused"), ("finished-run", "finished")):
        make_experiment(db, olga, slug=slug, status=status)
    with db.begin() as session:
        experiments.ban(session, experiments.get_visible(session, "banned-run", None), "vera")

    assert slugs(client, "vera") == ["open-run"]
    # each refusal is the join's own: the list and the join agree
    headers = api_token(client, "vera")
    for slug in ("private-run", "listed-run", "banned-run"):
        response = client.post(f"/api/experiments/{slug}/join", json={"peer_public_key": PEER_KEY}, headers=headers)
        assert response.status_code == 403, (slug, response.text)

    with db.begin() as session:  # vera opens the invite link: a member now
        experiments.accept_invite(session, "private-run", private.invite_code, session.merge(vera))
    assert slugs(client, "vera") == ["open-run", "private-run"]  # same need and rate: by name
    # the organizer may join all of their running experiments, however they take volunteers
    assert slugs(client, "olga") == ["banned-run", "listed-run", "open-run", "private-run"]


def test_an_experiment_where_the_volunteer_runs_as_many_peers_as_allowed_is_not_offered(client, db):
    """vera already runs two peers where the organizer allows two per volunteer: a third would wait for a free
    slot, so the list leaves that experiment out until one of her tokens expires."""
    olga = make_user(db, "olga")
    make_user(db, "vera")
    make_experiment(db, olga, slug="full-run", status="running", max_peers_per_volunteer=2)
    make_experiment(db, olga, slug="other-run", status="running")
    headers = api_token(client, "vera")
    keys = [RSAPrivateKey().get_public_key().to_bytes().decode() for _ in range(3)]
    assert slugs(client, "vera") == ["full-run", "other-run"]
    token = client.post("/api/experiments/full-run/swarm-token", json={"peer_public_key": keys[0]}, headers=headers)
    assert token.status_code == 200, token.text
    assert slugs(client, "vera") == ["full-run", "other-run"]  # one of two: room for another
    token = client.post("/api/experiments/full-run/swarm-token", json={"peer_public_key": keys[1]}, headers=headers)
    assert token.status_code == 200, token.text
    assert slugs(client, "vera") == ["other-run"]
    # the list and the join agree: her third peer is refused until a slot frees
    third = client.post("/api/experiments/full-run/join", json={"peer_public_key": keys[2]}, headers=headers)
    assert third.status_code == 429, third.text
    assert slugs(client, "olga") == ["full-run", "other-run"]  # her peers count against her only

    with db.begin() as session:  # her tokens expire unrenewed
        session.execute(update(SwarmPeerKey).values(expires_at=current_time() - timedelta(seconds=1)))
    assert slugs(client, "vera") == ["full-run", "other-run"]


def test_anonymous_callers_are_asked_to_log_in(client):
    response = client.get("/api/me/joinable")
    assert response.status_code == 401
