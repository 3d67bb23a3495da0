"""Rate limits shared through Redis (127.0.0.1:6379): several server processes count one budget per client
address, so a guesser gains nothing by spreading requests over replicas. Redis down fails open: log-in keeps
working, limited by each process on its own."""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from swarmhub.server.app import create_app
from swarmhub.server.core.settings import Settings
from swarmhub.server.http.ratelimit import LIMITS

from .conftest import PASSWORD, csrf_from, free_port, make_user

REDIS_URL = os.environ.get("SWARMHUB_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def redis_client() -> Iterator[object]:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"Redis is not reachable at {REDIS_URL} ({exc}); set SWARMHUB_TEST_REDIS_URL")
    yield client
    client.close()


@pytest.fixture
def shared(settings: Settings, redis_client) -> Iterator[Settings]:
    """Settings for replicas of one deployment, under a key prefix no other test run uses."""
    channel = f"swarmhub-test:{uuid.uuid4().hex}"
    yield settings.model_copy(update={"redis_url": REDIS_URL, "redis_channel": channel})
    for key in redis_client.scan_iter(f"{channel}:*"):
        redis_client.delete(key)


def wrong_login(client: TestClient) -> int:
    return client.post("/api/auth/token", json={"username": "alice", "password": "wrong"}).status_code


def test_replicas_share_one_login_budget(shared, db):
    make_user(db)
    limit, window = LIMITS["login"]
    with TestClient(create_app(shared)) as replica_a, TestClient(create_app(shared)) as replica_b:
        assert [wrong_login(replica_a) for _ in range(limit - 1)] == [401] * (limit - 1)
        assert wrong_login(replica_b) == 401  # the last one the budget allows, counted on the other replica
        for replica in (replica_a, replica_b):
            refused = replica.post("/api/auth/token", json={"username": "alice", "password": PASSWORD})
            assert refused.status_code == 429
            assert set(refused.json()) == {"detail"}
            seconds = int(refused.headers["retry-after"])
            assert 0 < seconds <= window
            assert refused.json()["detail"] == f"too many login attempts from your address: try again in {seconds} s"
        # the page form shares the budget across replicas too
        csrf = csrf_from(replica_b.get("/login").text)
        page = replica_b.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": csrf})
        assert page.status_code == 429 and "try again in" in page.text


def test_without_redis_each_replica_counts_alone(settings, db):
    make_user(db)
    limit, _ = LIMITS["login"]
    with TestClient(create_app(settings)) as replica_a, TestClient(create_app(settings)) as replica_b:
        assert [wrong_login(replica_a) for _ in range(limit)] == [401] * limit
        assert wrong_login(replica_a) == 429
        assert wrong_login(replica_b) == 401


def test_redis_keys_are_prefixed_hashed_bounded_and_expire(shared, db, redis_client):
    make_user(db)
    limit, window = LIMITS["login"]
    with TestClient(create_app(shared)) as replica:
        for _ in range(limit + 3):
            wrong_login(replica)
    keys = [key.decode() for key in redis_client.scan_iter(f"{shared.redis_channel}:*")]
    assert len(keys) == 1, keys
    (key,) = keys
    assert key.startswith(f"{shared.redis_channel}:ratelimit:login:")
    assert "testclient" not in key  # the client's address is hashed, never stored as sent
    assert redis_client.zcard(key) == limit  # refused hits are not counted: the set never outgrows the limit
    assert 0 < redis_client.pttl(key) <= window * 1000


def test_redis_down_fails_open_to_each_process_own_limit(settings, db, caplog):
    make_user(db)
    limit, _ = LIMITS["login"]
    down = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})  # nothing listens
    with caplog.at_level(logging.WARNING, logger="swarmhub.ratelimit"), TestClient(create_app(down)) as replica:
        ok = replica.post("/api/auth/token", json={"username": "alice", "password": PASSWORD})
        assert ok.status_code == 200, ok.text  # log-in does not go down with Redis
        assert "Redis did not answer" in caplog.text
        # ... and a guesser still meets this process's own limit
        statuses = [wrong_login(replica) for _ in range(limit)]
        assert statuses == [401] * (limit - 1) + [429]
