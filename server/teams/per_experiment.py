"""Teams per experiment: a team's verified samples, share and rank in each public experiment its members helped,
and an experiment's teams, both in pages by cursor (as the leaderboard's); every team in every experiment for the
open statistics export (:mod:`.export`).

Within an experiment the teams are ranked by their current members' verified samples there, then by name whatever
the case (names are unique so), then by id: a team's rank on its own page is its place on the experiment's."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from swarmhub.server.experiments.lifecycle import PUBLIC
from swarmhub.server.metrics.common import share_of
from swarmhub.server.models import Experiment, ExperimentTotal, Team, TeamMember, VolunteerTotal
from swarmhub.server.teams.schemas import (
    TEAM_EXPERIMENTS_LIMIT,
    TEAMS_LIMIT,
    ExperimentTeamCursor,
    ExperimentTeamRow,
    Page,
    TeamExperiment,
    TeamExperimentCursor,
    team_path,
)


def by_experiment_and_team(experiment_ids: Any = None) -> Any:
    """Each team's verified samples and contributors (members with verified samples) per experiment (of
    ``experiment_ids``, or all), drafts included: callers keep what may be seen."""
    query = (
        select(
            VolunteerTotal.experiment_id,
            TeamMember.team_id,
            func.sum(VolunteerTotal.verified_samples).label("verified"),
            func.count(VolunteerTotal.user_id).label("contributors"),
        )
        .join(TeamMember, TeamMember.user_id == VolunteerTotal.user_id)
        .where(VolunteerTotal.verified_samples > 0)
        .group_by(VolunteerTotal.experiment_id, TeamMember.team_id)
    )
    if experiment_ids is not None:
        query = query.where(VolunteerTotal.experiment_id.in_(experiment_ids))
    return query


def _experiment_url(slug: str) -> str:
    return f"/experiments/{quote(slug, safe='')}"


def experiments_by_team(session: Session) -> dict[int, list[TeamExperiment]]:
    """Every team's verified samples in each public experiment that its members helped, its share and its rank
    among the teams there; by team id, most verified first (then by slug). The export's: it reads every team."""
    by_team = by_experiment_and_team().subquery()
    rows = session.execute(
        select(by_team.c.experiment_id, by_team.c.team_id, by_team.c.verified, Experiment, ExperimentTotal)
        .join(Experiment, Experiment.id == by_team.c.experiment_id)
        .join(Team, Team.id == by_team.c.team_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == Experiment.id)
        .where(PUBLIC)
        .order_by(by_team.c.experiment_id, by_team.c.verified.desc(), func.lower(Team.name), Team.id)
    ).all()
    grouped: dict[int, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.experiment_id, []).append(row)
    found: dict[int, list[TeamExperiment]] = {}
    for group in grouped.values():
        for rank, row in enumerate(group, 1):
            found.setdefault(row.team_id, []).append(_team_experiment(row.Experiment, row.ExperimentTotal, row, rank))
    return {team_id: sorted(rows, key=lambda e: (-e.verified_samples, e.slug)) for team_id, rows in found.items()}


def _team_experiment(experiment: Experiment, totals: ExperimentTotal | None, row: Any, rank: int) -> TeamExperiment:
    total = totals.verified_samples if totals else 0
    return TeamExperiment(
        slug=experiment.slug,
        title=experiment.title,
        url=_experiment_url(experiment.slug),
        verified_samples=int(row.verified),
        share=share_of(int(row.verified), total),
        rank=rank,
    )


def _team_sums(team: Team) -> Any:
    """``team``'s verified samples in each public experiment its members helped."""
    return (
        select(VolunteerTotal.experiment_id, func.sum(VolunteerTotal.verified_samples).label("verified"))
        .join(TeamMember, TeamMember.user_id == VolunteerTotal.user_id)
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(TeamMember.team_id == team.id, VolunteerTotal.verified_samples > 0, PUBLIC)
        .group_by(VolunteerTotal.experiment_id)
    )


def team_experiments_total(session: Session, team: Team) -> int:
    """How many public experiments ``team``'s members helped."""
    return int(session.scalar(select(func.count()).select_from(_team_sums(team).subquery())) or 0)


def team_experiments_page(
    session: Session, team: Team, limit: int = TEAM_EXPERIMENTS_LIMIT, after: TeamExperimentCursor | None = None
) -> Page[TeamExperiment]:
    """``limit`` of the public experiments ``team``'s members helped, most verified first (then by slug), after
    the row ``after``; each with the team's share and its rank among the experiment's teams. Reads the team's rows
    and, for the ranks, the teams of the page's experiments only."""
    mine = _team_sums(team).subquery()
    query = (
        select(mine.c.verified, Experiment, ExperimentTotal)
        .join(Experiment, Experiment.id == mine.c.experiment_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == Experiment.id)
    )
    if after is not None:
        query = query.where(
            or_(mine.c.verified < after.verified, and_(mine.c.verified == after.verified, Experiment.slug > after.slug))
        )
    rows = session.execute(query.order_by(mine.c.verified.desc(), Experiment.slug).limit(limit + 1)).all()
    more, rows = len(rows) > limit, rows[:limit]
    ahead = _teams_ahead(session, team, [row.Experiment.id for row in rows])
    entries = [
        _team_experiment(row.Experiment, row.ExperimentTotal, row, ahead.get(row.Experiment.id, 0) + 1) for row in rows
    ]
    last = rows[-1] if rows else None
    next_cursor = TeamExperimentCursor(int(last.verified), last.Experiment.slug).encode() if more and last else None
    return Page(entries=entries, next_cursor=next_cursor)


def _teams_ahead(session: Session, team: Team, experiment_ids: list[int]) -> dict[int, int]:
    """Experiment ID -> how many teams stand ahead of ``team`` there (in the order of the experiment's teams)."""
    if not experiment_ids:
        return {}
    others = by_experiment_and_team(experiment_ids).subquery("others")
    mine = by_experiment_and_team(experiment_ids).where(TeamMember.team_id == team.id).subquery("mine")
    rows = session.execute(
        select(others.c.experiment_id, func.count())
        .join(mine, mine.c.experiment_id == others.c.experiment_id)
        .join(Team, Team.id == others.c.team_id)
        .where(
            or_(
                others.c.verified > mine.c.verified,
                and_(
                    others.c.verified == mine.c.verified,
                    tuple_(func.lower(Team.name), Team.id) < tuple_(func.lower(team.name), team.id),
                ),
            )
        )
        .group_by(others.c.experiment_id)
    ).tuples()
    return {experiment_id: int(count) for experiment_id, count in rows}


def experiment_standings_page(
    session: Session, experiment: Experiment, limit: int = TEAMS_LIMIT, after: ExperimentTeamCursor | None = None
) -> Page[ExperimentTeamRow]:
    """``limit`` of the teams of ``experiment`` (the caller checked it may be seen), most verified first, after the
    row ``after``; ``rank`` is the place among all of the experiment's teams."""
    by_team = by_experiment_and_team([experiment.id]).subquery()
    sort_name = func.lower(Team.name)
    query = select(Team.id, Team.name, sort_name.label("sort_name"), by_team.c.verified, by_team.c.contributors).join(
        Team, Team.id == by_team.c.team_id
    )
    if after is not None:
        query = query.where(
            or_(
                by_team.c.verified < after.verified,
                and_(
                    by_team.c.verified == after.verified,
                    tuple_(sort_name, Team.id) > tuple_(after.sort_name, after.team_id),
                ),
            )
        )
    rows = session.execute(query.order_by(by_team.c.verified.desc(), sort_name, Team.id).limit(limit + 1)).all()
    more, rows = len(rows) > limit, rows[:limit]
    totals = session.get(ExperimentTotal, experiment.id)
    total = totals.verified_samples if totals else 0
    first_rank = after.rank + 1 if after is not None else 1
    entries = [
        ExperimentTeamRow(
            rank=first_rank + i,
            name=row.name,
            url=team_path(row.name),
            verified_samples=int(row.verified),
            contributors=int(row.contributors),
            share=share_of(int(row.verified), total),
        )
        for i, row in enumerate(rows)
    ]
    next_cursor = None
    if more and rows:
        last = rows[-1]
        next_cursor = ExperimentTeamCursor(first_rank + len(rows) - 1, int(last.verified), last.sort_name, last.id)
    return Page(entries=entries, next_cursor=next_cursor.encode() if next_cursor else None)
