"""Volunteers' public side: a profile per volunteer (``/u/{username}`` and ``/api/users/{username}``), the open
statistics export of every visible volunteer (``/api/stats/volunteers.{json,csv}``), and hiding one's profile.

Every figure comes from the running totals the ledger keeps (``VolunteerTotal``, ``ExperimentTotal``, kept in step
by ``contributions.record`` and ``witnessed.record_rounds``), and the history from the ledger's witnessed rounds
(``RoundCredit``). Only experiments that everyone may see (not drafts) are shown. A hidden profile and an unknown
name answer the same 404, so hiding does not tell anyone the account exists; leaderboards still count a hidden
volunteer's work (the ledger is the ledger), without a link to the profile.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, Field
from sqlalchemy import BigInteger, Integer, cast, func, select
from sqlalchemy.orm import Session

from swarmhub.server.community import exports
from swarmhub.server.core.errors import NotFound
from swarmhub.server.experiments.lifecycle import PUBLIC
from swarmhub.server.ledger import milestones
from swarmhub.server.ledger.milestones import Milestone
from swarmhub.server.metrics.common import share_of
from swarmhub.server.models import (
    Experiment,
    ExperimentTotal,
    RoundCredit,
    Team,
    TeamMember,
    User,
    VolunteerTotal,
    WitnessedRound,
    utcnow,
)

# The history chart's resolution: the finest of these widths (seconds) that shows the whole span in at most
# HISTORY_POINTS buckets; the coarsest when none does.
HISTORY_WIDTHS = (60, 600, 3600, 6 * 3600, 86400, 7 * 86400)
HISTORY_POINTS = 200


def profile_path(username: str) -> str:
    return f"/u/{quote(username, safe='')}"


class ProfileExperiment(BaseModel):
    slug: str
    title: str
    status: str
    url: str = Field(description="The experiment's dashboard")
    verified_samples: int = Field(description="Credited through averaging rounds the server's peer witnessed")
    pending_samples: int = Field(description="In signed records of the epoch still open")
    share: float = Field(description="Fraction of the experiment's verified samples")
    time_online_seconds: float = Field(description="Time the swarm saw their peers publish records (summed per peer)")
    device_classes: list[str] = Field(description="Of the worker runs that reported: cpu, cuda, mps, ...")
    last_seen: datetime | None


class HistoryPoint(BaseModel):
    t: float = Field(description="Unix time (server clock) of the bucket's start")
    verified_samples: int = Field(description="Verified samples credited up to the end of this bucket, all experiments")


class VolunteerProfile(BaseModel):
    username: str
    member_since: datetime
    verified_samples: int = Field(description="Over the experiments listed")
    time_online_seconds: float = Field(description="Over the experiments listed, summed per peer")
    device_classes: list[str]
    experiments: list[ProfileExperiment] = Field(description="Most verified samples first")
    history_bucket_seconds: int | None = Field(description="The history's resolution; null without history")
    history: list[HistoryPoint] = Field(description="Verified samples over time, cumulative")
    team: str | None = Field(default=None, description="The team they are in now (/teams/{team}); null when none")
    milestones: list[Milestone] = Field(
        default_factory=list, description="Reached from verified work only (milestones.py), in a fixed order"
    )


class VolunteerStatsRow(BaseModel):
    username: str
    verified_samples: int = Field(description="Over every experiment they helped")
    experiments: int = Field(description="Experiments they helped (that anyone may see)")


class VolunteerStats(BaseModel):
    generated_at: datetime
    volunteers: list[VolunteerStatsRow] = Field(
        description="Every volunteer with a visible profile, most verified first"
    )


CSV_FIELDS = ("username", "verified_samples", "experiments")


def visible_user(session: Session, username: str) -> User:
    """The volunteer whose profile anyone may see, or 404 (the same for a name no one has and a hidden profile)."""
    user = None if "\x00" in username else session.scalar(select(User).where(User.username == username))
    if user is None or user.profile_hidden:
        raise NotFound(f"no volunteer {username!r}")
    return user


def profile(session: Session, username: str) -> VolunteerProfile:
    user = visible_user(session, username)
    rows = session.execute(
        select(VolunteerTotal, Experiment.slug, Experiment.title, Experiment.status, ExperimentTotal.verified_samples)
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == VolunteerTotal.experiment_id)
        .where(VolunteerTotal.user_id == user.id, PUBLIC)
        .order_by(VolunteerTotal.verified_samples.desc(), Experiment.slug)
    ).all()
    helped = []
    for total, slug, title, status, experiment_verified in rows:
        seen = [t for t in (total.last_report_at, total.last_signed_at) if t is not None]
        helped.append(
            ProfileExperiment(
                slug=slug,
                title=title,
                status=status,
                url=f"/experiments/{quote(slug, safe='')}",
                verified_samples=total.verified_samples,
                pending_samples=total.pending_samples,
                share=share_of(total.verified_samples, experiment_verified),
                time_online_seconds=round(total.online_seconds, 1),
                device_classes=sorted(total.device_classes or []),
                last_seen=max(seen) if seen else None,
            )
        )
    width, history = _history(session, user.id)
    return VolunteerProfile(
        username=user.username,
        member_since=user.created_at,
        verified_samples=sum(e.verified_samples for e in helped),
        time_online_seconds=round(sum(e.time_online_seconds for e in helped), 1),
        device_classes=sorted({cls for e in helped for cls in e.device_classes}),
        experiments=helped,
        history_bucket_seconds=width,
        history=history,
        team=session.scalar(
            select(Team.name).join(TeamMember, TeamMember.team_id == Team.id).where(TeamMember.user_id == user.id)
        ),
        milestones=milestones.for_profile(session, user.id),
    )


def _unix_seconds(session: Session, column: Any) -> Any:
    if session.get_bind().dialect.name == "postgresql":
        return cast(func.floor(func.extract("epoch", column)), BigInteger)
    return cast(func.strftime("%s", column), Integer)  # SQLite stores UTC text without an offset (UTCDateTime)


def _history(session: Session, user_id: int) -> tuple[int | None, list[HistoryPoint]]:
    """The volunteer's verified samples over time, cumulative, from the witnessed rounds that credited them: a
    grouped scan of their credits (``ix_round_credits_user_id``), at most HISTORY_POINTS buckets."""
    credits = (
        select(WitnessedRound.witnessed_at.label("at"), RoundCredit.credited.label("credited"))
        .join(WitnessedRound, WitnessedRound.id == RoundCredit.round_pk)
        .join(Experiment, Experiment.id == RoundCredit.experiment_id)
        .where(RoundCredit.user_id == user_id, RoundCredit.credited > 0, PUBLIC)
        .subquery()
    )
    first, last = session.execute(select(func.min(credits.c.at), func.max(credits.c.at))).one()
    if first is None:
        return None, []
    span = (last - first).total_seconds()
    width = next((w for w in HISTORY_WIDTHS if span < HISTORY_POINTS * w), HISTORY_WIDTHS[-1])
    bucket = (_unix_seconds(session, credits.c.at) // width).label("bucket")
    rows = session.execute(select(bucket, func.sum(credits.c.credited)).group_by(bucket).order_by(bucket)).all()
    points, total = [], 0
    for index, credited in rows:
        total += int(credited)
        points.append(HistoryPoint(t=float(int(index) * width), verified_samples=total))
    return width, points[-HISTORY_POINTS:]  # a span longer than the coarsest width shows its newest part


def set_hidden(session: Session, user: User, hidden: bool) -> None:
    user.profile_hidden = hidden
    session.flush()


def stats(session: Session) -> VolunteerStats:
    """Every volunteer with a visible profile who helped an experiment anyone may see: their verified samples and
    how many experiments they helped. A hidden profile is left out (its work still counts on every leaderboard)."""
    verified = func.sum(VolunteerTotal.verified_samples)
    rows = session.execute(
        select(User.username, verified, func.count(VolunteerTotal.experiment_id))
        .join(VolunteerTotal, VolunteerTotal.user_id == User.id)
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(User.profile_hidden.is_(False), PUBLIC)
        .group_by(User.id, User.username)
        .order_by(verified.desc(), func.lower(User.username))
    ).all()
    return VolunteerStats(
        generated_at=utcnow(),
        volunteers=[
            VolunteerStatsRow(username=n, verified_samples=int(v or 0), experiments=int(c)) for n, v, c in rows
        ],
    )


def stats_csv(data: VolunteerStats) -> str:
    return exports.csv_text(
        CSV_FIELDS, ((row.username, row.verified_samples, row.experiments) for row in data.volunteers)
    )


def stats_bodies(session: Session) -> tuple[bytes, str]:
    """The export's JSON and CSV, from one read so that they agree."""
    data = stats(session)
    return data.model_dump_json().encode(), stats_csv(data)
