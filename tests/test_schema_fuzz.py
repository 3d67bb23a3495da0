"""Schemathesis against the OpenAPI schema: generated requests to every JSON operation, signed in as a real
user; no response is a 5xx or breaks its documented schema. Bounded in examples per operation."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

from .conftest import api_token, make_experiment, make_user

# Operations that would end the fuzzer's own session, or that need a live swarm, have dedicated tests.
SKIP = {"DELETE /api/auth/token", "POST /api/experiments/{slug}/join"}
EXAMPLES = 20
# What a client relies on: no server error, documented status codes and content types, bodies that match the
# schema. (Whether a schema-valid body is also accepted is business logic: an unknown device code is a 400.)
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


def test_api_never_fails_or_breaks_its_schema(app, client, db):
    make_user(db, "fuzzer")
    make_experiment(db, make_user(db, "olga"), slug="fuzz-target", status="running")
    headers = api_token(client, "fuzzer")
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checked = []
    for result in schema.get_all_operations():
        operation = result.ok()
        label = f"{operation.method.upper()} {operation.path}"
        if label in SKIP:
            continue

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case: schemathesis.Case) -> None:
            case.call_and_validate(headers={**(case.headers or {}), **headers}, checks=CHECKS)

        check()
        checked.append(label)
    assert "POST /api/experiments" in checked and "GET /api/experiments/{slug}/leaderboard" in checked
    assert "GET /api/experiments/{slug}/swarm" in checked
    assert "GET /api/me/joinable" in checked
    assert {"GET /api/users/{username}", "GET /api/stats/volunteers.json", "GET /api/stats/volunteers.csv"} <= set(
        checked
    )
    assert {"GET /api/hub", "GET /api/stats/experiments.json", "GET /api/stats/experiments.csv"} <= set(checked)
    assert {"GET /api/stats/teams.json", "GET /api/stats/teams.csv"} <= set(checked)
    assert {
        "GET /api/teams",
        "POST /api/teams",
        "GET /api/teams/{slug}",
        "POST /api/teams/{slug}/join",
        "POST /api/teams/{slug}/leave",
        "DELETE /api/teams/{slug}/members/{username}",
        "POST /api/teams/{slug}/admins",
        "POST /api/teams/{slug}/rename",
        "DELETE /api/teams/{slug}",
        "GET /api/experiments/{slug}/teams",
    } <= set(checked)
