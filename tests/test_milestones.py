"""Milestones come from verified work only: credited rounds give the first-round and sample milestones (the 1M
one at 1M, not the 10M one), a checkpoint of a later epoch gives the checkpoint one unless a rollback discarded
the round; claimed and pending samples give none; a hidden profile shows none anywhere; leaderboard rows carry
the keys, read in one statement per page however many rows it has."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import event

from swarmhub.server import experiments
from swarmhub.server.corpus import training_data
from swarmhub.server.ledger import milestones
from swarmhub.server.models import utcnow
from swarmhub.server.services import services

from .conftest import make_experiment, make_user
from .support import observe, report_over_websocket, witness

pytestmark = pytest.mark.both_databases


def credit(db: Any, experiment_id: int, name: str, peer: str, rounds: list[tuple[str, int, float]]) -> Any:
    """``name``'s peer is seen in the swarm, then takes part alone in each (round ID, epoch, weight)."""
    t0 = utcnow()
    observe(db, experiment_id, t0, (name, peer, rounds[0][1], 100))
    for i, (round_id, epoch, weight) in enumerate(rounds, start=1):
        witness(db, experiment_id, t0 + timedelta(seconds=i), round_id, epoch, [(name, peer, weight)])
    return t0


def checkpoint(settings: Any, db: Any, experiment_id: int, epoch: int, restored_from: int | None = None) -> None:
    with db.begin() as session:
        experiment = session.get(experiments.Experiment, experiment_id)
        training_data.record_checkpoint(session, settings, experiment, epoch, 2.0, f"run/{epoch}", restored_from)


def reached(client: Any, name: str) -> dict[str, Any]:
    response = client.get(f"/api/users/{name}")
    assert response.status_code == 200, response.text
    return {m["key"]: m for m in response.json()["milestones"]}


def test_rounds_crossing_a_million_give_the_first_round_and_1m_but_not_10m(client, db):
    olga, _ = make_user(db, "olga"), make_user(db, "ada")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    t0 = credit(db, alpha.id, "ada", "QmA", [("r-1", 3, 600_000.0), ("r-2", 4, 450_000.0)])
    got = reached(client, "ada")
    assert list(got) == ["first_round", "samples_1m"]
    first = got["first_round"]["reached_at"]
    assert first.startswith((t0 + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%S"))  # the first round's time
    assert got["samples_1m"] == {"key": "samples_1m", "title": "1M verified samples", "reached_at": None}
    assert client.get("/api/users/ada").json()["verified_samples"] == 1_050_000

    page = client.get("/u/ada").text
    assert 'data-key="first_round"' in page and 'data-key="samples_1m"' in page
    assert 'data-key="samples_10m"' not in page


def test_one_round_short_of_a_million_is_not_the_1m_milestone(client, db):
    olga, _ = make_user(db, "olga"), make_user(db, "ada")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    credit(db, alpha.id, "ada", "QmA", [("r-1", 3, 999_999.0)])
    assert list(reached(client, "ada")) == ["first_round"]


def test_claimed_and_pending_samples_earn_nothing(client, db):
    olga, ada = make_user(db, "olga"), make_user(db, "ada")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    report_over_websocket(client, db, ada, "alpha", "cpu", 5_000_000)  # claimed over the websocket
    observe(db, alpha.id, utcnow(), ("ada", "QmA", 1, 200))  # pending in the open epoch, never in a round
    profile = client.get("/api/users/ada").json()
    assert profile["experiments"][0]["pending_samples"] == 200
    assert profile["milestones"] == []
    board = client.get("/api/experiments/alpha/leaderboard").json()
    assert [(e["username"], e["claimed_samples"], e["milestones"]) for e in board] == [("ada", 5_000_000, [])]
    assert "milestones" not in client.get("/u/ada").text.split("<main>")[1]


def test_a_checkpoint_of_a_later_epoch_holds_the_round_unless_a_rollback_dropped_it(client, db, settings):
    olga, _, _ = make_user(db, "olga"), make_user(db, "ada"), make_user(db, "grace")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    credit(db, alpha.id, "ada", "QmA", [("a-1", 5, 10.0)])
    credit(db, alpha.id, "grace", "QmG", [("g-1", 12, 10.0)])
    checkpoint(settings, db, alpha.id, 5)  # the state at epoch 5: before ada's round's step
    assert "checkpoint" not in reached(client, "ada")
    checkpoint(settings, db, alpha.id, 10)
    # Rolled back to epoch 10's checkpoint, shared at 20: grace's round at epoch 12 is not in any saved state.
    checkpoint(settings, db, alpha.id, 20, restored_from=10)
    checkpoint(settings, db, alpha.id, 25)
    ada = reached(client, "ada")
    assert ada["checkpoint"]["title"] == "Helped train a checkpoint" and ada["checkpoint"]["reached_at"] is not None
    assert "checkpoint" not in reached(client, "grace")
    board = {e["username"]: e["milestones"] for e in client.get("/api/experiments/alpha/leaderboard").json()}
    assert board == {"ada": ["first_round", "checkpoint"], "grace": ["first_round"]}


def test_hidden_profile_exposes_no_reached(client, db):
    olga, ada = make_user(db, "olga"), make_user(db, "ada")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    credit(db, alpha.id, "ada", "QmA", [("r-1", 3, 1_200_000.0)])
    assert client.get("/api/experiments/alpha/leaderboard").json()[0]["milestones"] == ["first_round", "samples_1m"]
    with db.begin() as session:
        session.get(type(ada), ada.id).profile_hidden = True
    assert client.get("/api/users/ada").status_code == 404
    assert client.get("/u/ada").status_code == 404
    [entry] = client.get("/api/experiments/alpha/leaderboard").json()
    assert (entry["username"], entry["samples"], entry["profile_url"], entry["milestones"]) == (
        "ada",
        1_200_000,
        None,
        [],
    )


def test_leaderboard_page_statements_do_not_grow_with_its_rows(app, client, db):
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement)

    def page_statements(rows: int) -> int:
        for i in range(len(client.get("/api/experiments/alpha/leaderboard").json()), rows):
            make_user(db, f"v{i}")
            credit(db, alpha.id, f"v{i}", f"Qm{i}", [(f"r{i}", 1, 10.0 + i)])
        statements.clear()
        event.listen(services(app).engine, "before_cursor_execute", count)
        try:
            board = client.get("/api/experiments/alpha/leaderboard").json()
        finally:
            event.remove(services(app).engine, "before_cursor_execute", count)
        assert len(board) == rows and all(e["milestones"] == ["first_round"] for e in board)
        return len(statements)

    assert page_statements(2) == page_statements(9)
    assert sum("round_credits" in s for s in statements) == 1  # the one milestone statement


def test_a_day_online_summed_over_peers_is_the_24h_milestone():
    # The profile's time online adds up per peer; twelve hours each of two peers make the day.
    assert milestones.reached(0, 2 * 12 * 3600.0, False, False) == ["online_24h"]
    assert milestones.reached(0, 24 * 3600.0 - 1, False, False) == []
    assert milestones.reached(100_000_000, 0.0, True, True) == [
        "first_round",
        "samples_1m",
        "samples_10m",
        "samples_100m",
        "checkpoint",
    ]
