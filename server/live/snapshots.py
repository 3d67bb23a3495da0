"""What a dashboard shows of an experiment, built the same way for the JSON API and the live channel."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy.orm import Session

from swarmhub.server import experiments, metrics
from swarmhub.server.core.settings import Settings
from swarmhub.server.corpus import training_data
from swarmhub.server.models import Experiment
from swarmhub.server.services import services
from swarmhub.server.swarm import leases

DASHBOARD_ROWS = 100  # the leaderboard's top rows on the dashboard and in each live snapshot


def base_url(request: Request, settings: Settings) -> str:
    return settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")


def metrics_public(session: Session, experiment: Experiment, app: FastAPI) -> metrics.MetricsPublic:
    settings: Settings = services(app).settings
    lease = leases.current(session, experiments.run_id(experiment))  # whichever process hosts the swarm
    swarm_peers = lease.peers if lease is not None else None
    return metrics.MetricsPublic(
        summary=metrics.summary(session, experiment, settings.active_window_seconds, swarm_peers),
        series=metrics.series(session, experiment),
        baseline=training_data.baseline(session, experiment),
    )


def dashboard_snapshot(session: Session, experiment: Experiment, app: FastAPI) -> dict[str, Any]:
    settings: Settings = services(app).settings
    board = metrics.leaderboard(session, experiment, settings.active_window_seconds, limit=DASHBOARD_ROWS)
    snapshot = {
        "type": "snapshot",
        "metrics": metrics_public(session, experiment, app).model_dump(mode="json"),
        "leaderboard": [entry.model_dump(mode="json") for entry in board],
    }
    if experiments.keeps_checkpoints(experiment):
        snapshot["checkpoints"] = [c.model_dump(mode="json") for c in training_data.checkpoints(session, experiment)]
    return snapshot
