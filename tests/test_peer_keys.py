"""One account runs a bounded number of swarm peers per experiment: the keys it holds valid swarm tokens for are
counted against the experiment's ``max_peers_per_volunteer``, a key is one volunteer's, a key must be RSA of at
least 2048 bits, and tokens are rate-limited per account. Through the real API and forms, on SQLite and
PostgreSQL."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from hivemind.utils.crypto import RSAPrivateKey
from sqlalchemy import select, update

from swarmhub.common.tokens import peer_id_for_public_key
from swarmhub.server.core.db import alembic_config
from swarmhub.server.http.ratelimit import LIMITS
from swarmhub.server.models import Experiment, SwarmPeerKey, User, utcnow

from .conftest import api_token, csrf_from, login, make_experiment, make_user

pytestmark = pytest.mark.both_databases  # admission is an upsert, per dialect

SLUG = "digits-run"
KEYS = [RSAPrivateKey().get_public_key().to_bytes().decode() for _ in range(6)]  # 2048-bit, as workers make
SMALL_KEY = (
    rsa.generate_private_key(public_exponent=65537, key_size=1024)
    .public_key()
    .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    .decode()
)


def ask(client, headers, key: str, route: str = "swarm-token", slug: str = SLUG):
    return client.post(f"/api/experiments/{slug}/{route}", json={"peer_public_key": key}, headers=headers)


def held_keys(db) -> dict[str, str]:
    """peer ID -> the username it was issued to."""
    with db() as session:
        rows = session.execute(select(SwarmPeerKey.peer_id, User.username).join(User, User.id == SwarmPeerKey.user_id))
        return dict(rows.tuples().all())


def expiry_of(db, key: str):
    with db() as session:
        return session.scalar(
            select(SwarmPeerKey.expires_at).where(SwarmPeerKey.peer_id == peer_id_for_public_key(key.encode()))
        )


@pytest.fixture
def volunteers(client, db):
    """olga organizes a running experiment (she is the first account: the administrator); bob and carol volunteer."""
    olga = make_user(db, "olga")
    make_user(db, "bob")
    make_user(db, "carol")
    make_experiment(db, olga, slug=SLUG, status="running")
    return {name: api_token(client, name) for name in ("olga", "bob", "carol")}


def test_a_fifth_peer_waits_for_a_free_slot_and_a_running_peer_still_renews(client, db, volunteers):
    bob = volunteers["bob"]
    issued = [ask(client, bob, key) for key in KEYS[:4]]
    assert [response.status_code for response in issued] == [200] * 4
    first_expiry = min(response.json()["expiration_time"] for response in issued)

    refused = ask(client, bob, KEYS[4])
    assert refused.status_code == 429
    assert refused.json() == {
        "detail": f"you already run 4 peers in {SLUG!r}, and its organizer allows 4 per volunteer "
        f"(max_peers_per_volunteer): stop one of your peers or wait for its token to expire at {first_expiry}",
        "field": "peer_public_key",
    }
    assert 3500 < int(refused.headers["retry-after"]) <= 3600  # the first token's hour, less this test's seconds
    joining = ask(client, bob, KEYS[4], route="join")  # refused before the join waits for the swarm
    assert (joining.status_code, joining.json()["field"]) == (429, "peer_public_key")

    before = expiry_of(db, KEYS[0])
    renewed = ask(client, bob, KEYS[0])  # a peer that runs renews its token at the limit
    assert renewed.status_code == 200
    assert expiry_of(db, KEYS[0]) >= before
    # A known key passes the join's checks too (this server runs no swarm, so the join stops there)
    assert ask(client, bob, KEYS[0], route="join").status_code == 503
    assert held_keys(db) == {peer_id_for_public_key(key.encode()): "bob" for key in KEYS[:4]}


def test_peers_starting_at_once_get_exactly_the_limit(live_server, client, db, volunteers):
    """Six new keys of one volunteer asked for at the same moment, through a real server's threads, each from a
    machine logged in on its own: four tokens."""
    url = f"{live_server.url}/api/experiments/{SLUG}/swarm-token"
    machines = [api_token(client, "bob") for _ in KEYS]

    def ask_at_once(key: str, bob: dict[str, str]) -> httpx.Response:
        # What is asserted is the count, not the latency: six token signatures queued on a loaded machine took
        # over httpx's default 5 s once.
        return httpx.post(url, json={"peer_public_key": key}, headers=bob, timeout=60)

    with ThreadPoolExecutor(len(KEYS)) as pool:
        answers = list(pool.map(ask_at_once, KEYS, machines))
    assert sorted(answer.status_code for answer in answers) == [200] * 4 + [429] * 2
    admitted = {peer_id_for_public_key(key.encode()) for key, answer in zip(KEYS, answers) if answer.status_code == 200}
    assert held_keys(db) == dict.fromkeys(admitted, "bob")


def test_an_expired_token_frees_its_slot(client, db, volunteers):
    bob = volunteers["bob"]
    assert [ask(client, bob, key).status_code for key in KEYS[:4]] == [200] * 4
    assert ask(client, bob, KEYS[4]).status_code == 429
    with db.begin() as session:  # KEYS[0]'s peer stopped: its token ran out a second ago
        session.execute(
            update(SwarmPeerKey)
            .where(SwarmPeerKey.peer_id == peer_id_for_public_key(KEYS[0].encode()))
            .values(expires_at=utcnow() - timedelta(seconds=1))
        )
    assert ask(client, bob, KEYS[4]).status_code == 200
    # The stopped peer comes back: it needs a free slot, as a new key does, and its key stays bob's
    returning = ask(client, bob, KEYS[0])
    assert (returning.status_code, returning.json()["field"]) == (429, "peer_public_key")
    assert expiry_of(db, KEYS[0]) < utcnow()
    assert len(held_keys(db)) == 5


def test_a_key_under_2048_bits_is_refused(client, db, volunteers):
    for route in ("swarm-token", "join"):
        refused = ask(client, volunteers["bob"], SMALL_KEY, route=route)
        assert refused.status_code == 400, route
        assert refused.json()["field"] == "peer_public_key"
        assert refused.json()["detail"].startswith(
            "peer_public_key is a 1024-bit RSA key: a peer's key needs at least 2048"
        )
    assert held_keys(db) == {}


def test_another_volunteers_key_is_refused(client, db, volunteers):
    assert ask(client, volunteers["bob"], KEYS[0]).status_code == 200
    for route in ("swarm-token", "join"):
        taken = ask(client, volunteers["carol"], KEYS[0], route=route)
        assert taken.status_code == 409, route
        assert taken.json() == {
            "detail": f"this peer key was issued to another volunteer of {SLUG!r}: every volunteer's peers need keys "
            "of their own",
            "field": "peer_public_key",
        }
    assert ask(client, volunteers["carol"], KEYS[1]).status_code == 200
    assert held_keys(db) == {
        peer_id_for_public_key(KEYS[0].encode()): "bob",
        peer_id_for_public_key(KEYS[1].encode()): "carol",
    }
    # A key is one volunteer's in one experiment: elsewhere it is free
    make_experiment(db, make_user(db, "otto"), slug="other-run", status="running")
    assert ask(client, volunteers["carol"], KEYS[0], slug="other-run").status_code == 200


def test_swarm_tokens_are_rate_limited_per_account(client, db, volunteers):
    bob = volunteers["bob"]
    limit, window = LIMITS["swarm-token"]
    assert [ask(client, bob, KEYS[0]).status_code for _ in range(limit - 1)] == [200] * (limit - 1)
    assert ask(client, bob, KEYS[0], route="join").status_code == 503  # counted too: one budget for both routes
    for route in ("swarm-token", "join"):
        limited = ask(client, bob, KEYS[0], route=route)
        assert limited.status_code == 429, route
        assert limited.json()["detail"].startswith("too many swarm token requests from your account: try again in")
        assert 0 < int(limited.headers["retry-after"]) <= window
    # By account, not by address: carol asks from the same address as bob
    assert ask(client, volunteers["carol"], KEYS[1]).status_code == 200


def test_the_organizer_sets_the_limit_and_it_applies_to_everyone(client, db, volunteers):
    olga, bob = volunteers["olga"], volunteers["bob"]
    url = f"/api/experiments/{SLUG}"
    assert client.get(url).json()["max_peers_per_volunteer"] == 4
    for wrong in (0, 65, "many"):
        refused = client.patch(url, json={"max_peers_per_volunteer": wrong}, headers=olga)
        assert refused.status_code == 422, wrong
        assert refused.json()["detail"][0]["loc"] == ["body", "max_peers_per_volunteer"]
    assert client.patch(url, json={"max_peers_per_volunteer": 9}, headers=bob).status_code == 403
    # Not a training setting: it changes while the swarm runs
    assert client.patch(url, json={"max_peers_per_volunteer": 2}, headers=olga).json()["max_peers_per_volunteer"] == 2

    assert [ask(client, bob, key).status_code for key in KEYS[:2]] == [200, 200]
    third = ask(client, bob, KEYS[2])
    assert third.status_code == 429 and "its organizer allows 2 per volunteer" in third.json()["detail"]
    client.patch(url, json={"max_peers_per_volunteer": 3}, headers=olga)
    assert ask(client, bob, KEYS[2]).status_code == 200
    client.patch(url, json={"max_peers_per_volunteer": 1}, headers=olga)  # running peers keep renewing
    assert [ask(client, bob, key).status_code for key in KEYS[:3]] == [200] * 3

    # The organizer, an administrator, counts like everyone else
    assert ask(client, olga, KEYS[3]).status_code == 200
    assert ask(client, olga, KEYS[4]).status_code == 429

    created = client.post(
        "/api/experiments",
        json={"slug": "wide-run", "title": "Wide", "task": "digits", "max_peers_per_volunteer": 64},
        headers=bob,
    )
    assert created.status_code == 201 and created.json()["max_peers_per_volunteer"] == 64


FORM = {
    "title": "Digits together",
    "slug": "digits-together",
    "task": "digits",
    "optimizer": "adam",
    "learning_rate": "0.002",
    "target_batch_size": "128",
    "matchmaking_time": "2",
    "averaging_timeout": "30",
}


def test_the_experiment_form_shows_and_saves_the_limit(client, db):
    make_user(db, "olga")
    csrf = login(client, "olga")

    def stored() -> int:
        with db() as session:
            return session.scalar(select(Experiment.max_peers_per_volunteer))

    assert 'name="max_peers_per_volunteer" value="4"' in client.get("/experiments/new").text
    created = client.post(
        "/experiments/new", data={**FORM, "csrf_token": csrf, "max_peers_per_volunteer": "7"}, follow_redirects=False
    )
    assert created.status_code == 303 and stored() == 7
    edit = client.get("/experiments/digits-together/edit").text
    assert 'name="max_peers_per_volunteer" value="7"' in edit
    form = {**FORM, "csrf_token": csrf_from(edit)}
    too_many = client.post("/experiments/digits-together/edit", data={**form, "max_peers_per_volunteer": "65"})
    assert too_many.status_code == 422
    assert 'id="error-max_peers_per_volunteer"' in too_many.text and 'value="65"' in too_many.text
    assert stored() == 7
    saved = client.post(
        "/experiments/digits-together/edit", data={**form, "max_peers_per_volunteer": "2"}, follow_redirects=False
    )
    assert saved.status_code == 303 and stored() == 2


def test_a_removed_volunteer_gets_no_token_for_any_key(client, db, volunteers):
    olga, bob = volunteers["olga"], volunteers["bob"]
    assert [ask(client, bob, key).status_code for key in KEYS[:2]] == [200, 200]
    assert client.post(f"/api/experiments/{SLUG}/bans", json={"username": "bob"}, headers=olga).status_code == 204
    removed = {"detail": f"you were removed from {SLUG!r} by its organizer", "removed": True}
    for key in KEYS[:3]:  # the keys with a valid token, and a new one
        for route in ("swarm-token", "join"):
            refused = ask(client, bob, key, route=route)
            assert (refused.status_code, refused.json()) == (403, removed), (route, KEYS.index(key))
    assert set(held_keys(db).values()) == {"bob"} and len(held_keys(db)) == 2


def test_0012_gives_existing_experiments_the_default_limit_and_downgrades(empty_database):
    engine = empty_database
    config = alembic_config(engine)
    command.upgrade(config, "0011")
    experiments_0011 = sa.Table("experiments", sa.MetaData(), autoload_with=engine)  # as it was: no limit column
    now = utcnow()
    old_run = {
        "id": 1,
        "slug": "old-run",
        "title": "Old",
        "description": "",
        "owner_id": 1,
        "status": "running",
        "task": "digits",
        "task_params": {},
        "optimizer": "lamb",
        "learning_rate": 0.01,
        "target_batch_size": 128,
        "matchmaking_time": 2.0,
        "averaging_timeout": 30.0,
        "signing_key": "key",
        "join_policy": "open",
        "allowlist": [],
        "invite_code": "code",
        "created_at": now,
        "updated_at": now,
    }
    with engine.begin() as conn:
        conn.execute(sa.insert(User.__table__), [{"id": 1, "username": "olga", "password_hash": "x"}])
        conn.execute(sa.insert(experiments_0011), [old_run])

    command.upgrade(config, "0012")
    row = {
        "experiment_id": 1,
        "user_id": 1,
        "peer_id": peer_id_for_public_key(KEYS[0].encode()),
        "public_key": KEYS[0],
        "first_issued_at": now,
        "expires_at": now,
    }
    with engine.begin() as conn:
        assert conn.scalar(sa.select(Experiment.max_peers_per_volunteer)) == 4
        conn.execute(sa.insert(SwarmPeerKey.__table__), [row])
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:  # a peer ID is one volunteer's per experiment
        conn.execute(sa.insert(SwarmPeerKey.__table__), [row])

    command.downgrade(config, "0011")
    inspector = sa.inspect(engine)
    assert "swarm_peer_keys" not in inspector.get_table_names()
    assert "max_peers_per_volunteer" not in {c["name"] for c in inspector.get_columns("experiments")}
    with engine.connect() as conn:
        assert list(conn.scalars(sa.text("SELECT slug FROM experiments"))) == ["old-run"]
