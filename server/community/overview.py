"""The hub at a glance: every public experiment's collaboration as it stands (volunteers online, throughput,
verified samples, progress and an ETA where the task has a number of steps) and the hub's totals, for the front
page, ``GET /api/hub`` and the open statistics export (``/api/stats/experiments.json`` and ``.csv``).

Everything is read from the running totals the write path keeps (``experiment_totals``, ``volunteer_totals``)
and from the worker runs' last reports, as the dashboard's summary is, in two aggregate statements for the whole
hub (:func:`snapshot`). Each server process keeps what it built for a while (:class:`HubCache`), so a busy front
page or a crawler costs the database at most those two statements per interval.

Public means what a visitor may see: every experiment but drafts (``experiments.PUBLIC``, beside ``can_view``). What
is cached here is the same for every viewer, so it never includes an organizer's own drafts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from sqlalchemy import and_, distinct, exists, func, or_, select
from sqlalchemy.orm import Session

from swarmhub.common.protocol import ExperimentStatus
from swarmhub.server.community import exports
from swarmhub.server.experiments.lifecycle import PUBLIC
from swarmhub.server.metrics.common import current_time
from swarmhub.server.models import Checkpoint, Experiment, ExperimentTotal, User, VolunteerTotal, WorkerRun

HUB_REFRESH_SECONDS = 2.0  # the front page and /api/hub: at most one rebuild per process per interval


class HubExperiment(BaseModel):
    """One public experiment as the front page shows it."""

    slug: str
    title: str
    status: str
    task: str
    organizer: str
    created_at: datetime
    volunteers_online: int = Field(description="volunteers with a worker that reported within the active window")
    volunteers: int = Field(description="volunteers who contributed samples (claimed or verified) so far")
    samples_per_second: float = Field(description="the active workers' reported rates, summed (as the dashboard)")
    verified_samples: int = Field(description="samples credited through averaging rounds the server witnessed")
    step: int = Field(description="the swarm's collaborative step (epoch), as its workers report it")
    total_steps: int | None = Field(description="the step the task's schedule ends at; null: the task has none")
    progress: float | None = Field(description="step / total_steps, 0 to 1; null without total_steps")
    eta_seconds: float | None = Field(
        description="seconds to total_steps at the current rate (target_batch_size samples a step); null unless "
        "the experiment is running, has a rate and a total_steps not yet reached"
    )


class HubTotals(BaseModel):
    """The whole hub: public experiments only."""

    experiments: int
    running_experiments: int
    volunteers_online: int = Field(description="distinct volunteers with a worker that reported within the window")
    volunteers: int = Field(description="distinct volunteers who contributed samples to any public experiment")
    samples_per_second: float
    verified_samples: int
    claimed_samples: int = Field(description="what volunteers' workers reported, verified or not")
    finished_experiments: int
    models_trained: int = Field(description="experiments that finished or hold at least one saved model checkpoint")


class HubPublic(BaseModel):
    generated_at: datetime
    totals: HubTotals
    experiments: list[HubExperiment]


class ExperimentStats(BaseModel):
    """One row of the open statistics export."""

    slug: str
    title: str
    status: str
    volunteers: int = Field(description="volunteers who contributed samples (claimed or verified) so far")
    verified_samples: int
    created_at: datetime


STATS_FIELDS = tuple(ExperimentStats.model_fields)


def _contributed() -> Any:
    return or_(VolunteerTotal.claimed_samples > 0, VolunteerTotal.verified_samples > 0)


def _rows_statement(since: datetime) -> Any:
    active = (
        select(
            WorkerRun.experiment_id,
            func.count(distinct(WorkerRun.user_id)).label("online"),
            func.sum(WorkerRun.samples_per_second).label("rate"),
        )
        .where(WorkerRun.last_seen_at >= since)
        .group_by(WorkerRun.experiment_id)
        .subquery()
    )
    helped = (
        select(VolunteerTotal.experiment_id, func.count().label("volunteers"))
        .where(_contributed())
        .group_by(VolunteerTotal.experiment_id)
        .subquery()
    )
    checkpointed = exists().where(Checkpoint.experiment_id == Experiment.id)
    return (
        select(
            Experiment.slug,
            Experiment.title,
            Experiment.status,
            Experiment.task,
            Experiment.task_params,
            Experiment.target_batch_size,
            Experiment.created_at,
            User.username,
            ExperimentTotal.verified_samples,
            ExperimentTotal.claimed_samples,
            ExperimentTotal.worker_epoch,
            active.c.online,
            active.c.rate,
            helped.c.volunteers,
            checkpointed.label("checkpointed"),
        )
        .join(User, User.id == Experiment.owner_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == Experiment.id)
        .outerjoin(active, active.c.experiment_id == Experiment.id)
        .outerjoin(helped, helped.c.experiment_id == Experiment.id)
        .where(PUBLIC)
        .order_by(Experiment.created_at.desc(), Experiment.id.desc())
    )


def _people_statement(since: datetime) -> Any:
    """The hub's distinct volunteers, online now and ever: a volunteer in two experiments counts once."""
    public = select(Experiment.id).where(PUBLIC)
    online = select(func.count(distinct(WorkerRun.user_id))).where(
        WorkerRun.last_seen_at >= since, WorkerRun.experiment_id.in_(public)
    )
    helped = select(func.count(distinct(VolunteerTotal.user_id))).where(
        and_(_contributed(), VolunteerTotal.experiment_id.in_(public))
    )
    return select(online.scalar_subquery().label("online"), helped.scalar_subquery().label("helped"))


def eta_seconds(status: str, step: int, total_steps: int | None, batch: int, rate: float) -> float | None:
    """Seconds to ``total_steps`` at ``rate`` samples/s, a step being ``batch`` samples; None where there is no
    honest figure: not running, no rate, no total, or the total already reached."""
    if status != ExperimentStatus.running.value or rate <= 0 or not total_steps or step >= total_steps:
        return None
    return round((total_steps - step) * batch / rate, 1)


def _total_steps(params: Any) -> int | None:
    value = params.get("total_steps") if isinstance(params, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def snapshot(session: Session, window_seconds: int) -> HubPublic:
    """The hub as it stands: two statements, whatever the number of experiments and volunteers."""
    now = current_time()
    since = now - timedelta(seconds=window_seconds)
    rows = session.execute(_rows_statement(since)).all()
    people = session.execute(_people_statement(since)).one()
    listed = []
    for row in rows:
        step = int(row.worker_epoch or 0)
        total = _total_steps(row.task_params)
        rate = round(float(row.rate or 0.0), 2)
        listed.append(
            HubExperiment(
                slug=row.slug,
                title=row.title,
                status=row.status,
                task=row.task,
                organizer=row.username,
                created_at=row.created_at,
                volunteers_online=int(row.online or 0),
                volunteers=int(row.volunteers or 0),
                samples_per_second=rate,
                verified_samples=int(row.verified_samples or 0),
                step=step,
                total_steps=total,
                progress=min(1.0, round(step / total, 4)) if total else None,
                eta_seconds=eta_seconds(row.status, step, total, int(row.target_batch_size), rate),
            )
        )
    totals = HubTotals(
        experiments=len(rows),
        running_experiments=sum(r.status == ExperimentStatus.running.value for r in rows),
        volunteers_online=int(people.online or 0),
        volunteers=int(people.helped or 0),
        samples_per_second=round(sum(e.samples_per_second for e in listed), 2),
        verified_samples=sum(e.verified_samples for e in listed),
        claimed_samples=sum(int(r.claimed_samples or 0) for r in rows),
        finished_experiments=sum(r.status == ExperimentStatus.finished.value for r in rows),
        models_trained=sum(r.status == ExperimentStatus.finished.value or bool(r.checkpointed) for r in rows),
    )
    return HubPublic(generated_at=now, totals=totals, experiments=listed)


@dataclass(frozen=True)
class Export:
    json: exports.Encoded
    csv: exports.Encoded


def export(hub: HubPublic) -> Export:
    """The statistics export of a snapshot: JSON (a list of rows) and CSV (a header, then the same rows)."""
    rows = [
        ExperimentStats(
            slug=e.slug,
            title=e.title,
            status=e.status,
            volunteers=e.volunteers,
            verified_samples=e.verified_samples,
            created_at=e.created_at,
        ).model_dump(mode="json")
        for e in hub.experiments
    ]
    text = exports.csv_text(STATS_FIELDS, ([row[name] for name in STATS_FIELDS] for row in rows))
    as_json = json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode()
    return Export(json=exports.Encoded.of(as_json, exports.JSON), csv=exports.Encoded.of(text.encode(), exports.CSV))


class HubCache:
    """What one server process built last: the snapshot (front page, ``/api/hub``) and the statistics export,
    which is rebuilt at most every ``stats_seconds`` (``SWARMHUB_STATS_CACHE_SECONDS``)."""

    def __init__(self, window_seconds: int, stats_seconds: float):
        self.window_seconds = window_seconds
        self._hub = exports.Kept(HUB_REFRESH_SECONDS)
        self._export = exports.Kept(stats_seconds)

    def hub(self, session: Session) -> HubPublic:
        return self._hub_and_body(session)[0]

    def hub_body(self, session: Session) -> exports.Encoded:
        """``/api/hub``'s JSON, encoded (and gzipped) once per rebuild rather than once per poll."""
        return self._hub_and_body(session)[1]

    def _hub_and_body(self, session: Session) -> tuple[HubPublic, exports.Encoded]:
        def build() -> tuple[HubPublic, exports.Encoded]:
            value = snapshot(session, self.window_seconds)
            return value, exports.Encoded.of(value.model_dump_json().encode(), exports.JSON)

        kept: tuple[HubPublic, exports.Encoded] = self._hub.get(build)
        return kept

    def export(self, session: Session) -> Export:
        value: Export = self._export.get(lambda: export(snapshot(session, self.window_seconds)))
        return value
