"""A route's side effects run after its unit of work commits: the swarm's reconcile, woken by a status change or a
removal, reads from its own session what the request wrote, and is not woken by a request that failed."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select

from swarmhub.server.http.deps import after_commit, get_session
from swarmhub.server.models import Experiment, ExperimentBan
from swarmhub.server.services import services

from .conftest import api_token, make_experiment, make_user


def watch_reconcile(app: Any) -> list[dict[str, Any]]:
    """What each wake-up of the reconcile finds in the database, read as the reconcile reads it (its own session)."""
    seen: list[dict[str, Any]] = []

    def reconcile_soon() -> None:
        with services(app).sessionmaker() as session:
            experiment = session.scalar(select(Experiment).where(Experiment.slug == "watched"))
            bans = session.scalars(select(ExperimentBan).where(ExperimentBan.experiment_id == experiment.id)).all()
            seen.append({"status": experiment.status, "bans": len(bans)})

    services(app).coordinator.reconcile_soon = reconcile_soon  # type: ignore[method-assign]
    return seen


def test_the_reconcile_reads_what_the_request_committed(app, client, db):
    owner = make_user(db, "olga")
    make_user(db, "mallory")
    make_experiment(db, owner, slug="watched")
    headers = api_token(client, "olga")
    seen = watch_reconcile(app)

    started = client.post("/api/experiments/watched/status", headers=headers, json={"action": "start"})
    assert started.status_code == 200, started.text
    assert seen == [{"status": "running", "bans": 0}]

    removed = client.post("/api/experiments/watched/bans", headers=headers, json={"username": "mallory"})
    assert removed.status_code == 204, removed.text
    assert seen[-1] == {"status": "running", "bans": 1}


def test_an_action_runs_after_the_commit_and_never_after_a_rollback(app, db):
    """The request's unit of work itself (``deps.get_session``): what a route registered runs once the commit is
    done, and is dropped when the route fails after registering it."""
    owner = make_user(db, "olga")
    make_experiment(db, owner, slug="watched")
    seen = watch_reconcile(app)
    request = SimpleNamespace(app=app)

    work = get_session(request)
    session = next(work)
    session.scalar(select(Experiment).where(Experiment.slug == "watched")).status = "running"
    after_commit(session, services(app).coordinator.reconcile_soon)
    assert seen == []  # not before the commit
    with pytest.raises(StopIteration):
        next(work)  # the route returned: commit, then the actions
    assert seen == [{"status": "running", "bans": 0}]

    work = get_session(request)
    session = next(work)
    session.scalar(select(Experiment).where(Experiment.slug == "watched")).status = "paused"
    after_commit(session, services(app).coordinator.reconcile_soon)
    with pytest.raises(RuntimeError):
        work.throw(RuntimeError("the route failed"))
    assert seen == [{"status": "running", "bans": 0}]  # rolled back: nothing written, nothing woken
