"""Prometheus metrics at /metrics: request counts by route template, websocket connections, ingested metric
messages (stored and duplicate), and the optional scrape token."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from swarmhub.server.app import create_app

from .conftest import api_token, make_experiment, make_user
from .support import report, url, worker_run


def samples(client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def test_requests_websockets_and_ingested_messages_are_counted(client, db):
    alice = make_user(db)
    make_experiment(db, alice, slug="live", status="running")
    headers, worker_id = api_token(client), worker_run(db, alice, "live")
    for _ in range(3):
        assert client.get("/api/experiments/live").status_code == 200
    assert client.get("/api/experiments/nope").status_code == 404
    with client.websocket_connect(url(worker_id), headers=headers) as ws:
        during = samples(client)
        for seq in (0, 1, 1):  # the last is a re-sent duplicate
            ws.send_text(report(seq))
            assert json.loads(ws.receive_text())["type"] == "ack"
    after = samples(client)
    route = "/api/experiments/{slug}"
    assert after[("swarmhub_http_requests_total", (("method", "GET"), ("route", route), ("status", "200")))] == 3
    assert after[("swarmhub_http_requests_total", (("method", "GET"), ("route", route), ("status", "404")))] == 1
    assert during[("swarmhub_websocket_connections", (("channel", "report"),))] == 1
    assert after[("swarmhub_websocket_connections", (("channel", "report"),))] == 0
    assert after[("swarmhub_metric_messages_ingested_total", (("outcome", "stored"),))] == 2
    assert after[("swarmhub_metric_messages_ingested_total", (("outcome", "duplicate"),))] == 1
    # Raw paths never become labels: one series per route, however many slugs are asked for.
    assert not any("nope" in str(labels) for _, labels in after)


def test_scrape_token(settings):
    with TestClient(create_app(settings.model_copy(update={"metrics_token": "s3cret-scrape"}))) as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer s3cret-scrape"}).status_code == 200
