"""The experiments a volunteer may join now, most needed first: what ``swarmhub join --any`` chooses from
(``GET /api/me/joinable``).

Whether the volunteer may join is the join's own checks, applied to every running experiment, so the list never
offers what the join would refuse: :func:`.membership.check_joinable` (running, not removed, invited or listed where
the experiment asks for it) and :func:`.admission.check_room` (fewer peer keys with a valid swarm token there than its
organizer allows, ``max_peers_per_volunteer``: else a new peer of theirs is refused, 429, until one of those tokens
expires). An entry names no reason: what the join would refuse is left out, and the join's answer says why. How much
each needs peers is :func:`swarmhub.common.choice.need` of its peers online: the worker runs that reported within the
active window, as ``/api/hub`` counts volunteers online.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import distinct, func, select
from sqlalchemy.orm import Session

from swarmhub.common.choice import JoinableExperiment, by_need, need
from swarmhub.server.core.errors import AppError
from swarmhub.server.experiments.admission import PeersHeld, check_room, peers_held
from swarmhub.server.experiments.lifecycle import running
from swarmhub.server.experiments.membership import check_joinable
from swarmhub.server.metrics.common import current_time
from swarmhub.server.models import User, WorkerRun, utcnow

NO_PEERS = PeersHeld()


def joinable(session: Session, user: User, window_seconds: int) -> list[JoinableExperiment]:
    """Every running experiment ``user`` may join, with its peers online and its need; most needed first."""
    since = current_time() - timedelta(seconds=window_seconds)
    online = {
        row.experiment_id: row
        for row in session.execute(
            select(
                WorkerRun.experiment_id,
                func.count().label("peers"),
                func.count(distinct(WorkerRun.user_id)).label("volunteers"),
                func.sum(WorkerRun.samples_per_second).label("rate"),
            )
            .where(WorkerRun.last_seen_at >= since)
            .group_by(WorkerRun.experiment_id)
        )
    }
    now = utcnow()  # admission's clock, as the join's count of peer keys
    held = peers_held(session, user, now)
    listed = []
    for experiment in running(session):
        try:
            check_joinable(session, experiment, user)
            check_room(experiment, held.get(experiment.id, NO_PEERS), now)
        except AppError:  # the join would refuse it too: removed, not invited or listed, or a new peer would wait
            continue
        row = online.get(experiment.id)
        peers = int(row.peers) if row is not None else 0
        listed.append(
            JoinableExperiment(
                slug=experiment.slug,
                title=experiment.title,
                task=experiment.task,
                peers_online=peers,
                volunteers_online=int(row.volunteers) if row is not None else 0,
                samples_per_second=round(float(row.rate or 0.0), 2) if row is not None else 0.0,
                need=need(peers),
            )
        )
    return by_need(listed)
