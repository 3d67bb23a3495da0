"""Teams: lookups and the standings (hub-wide, per experiment, per team); the open statistics export is in
:mod:`.export`."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from swarmhub.server.community.volunteers import profile_path
from swarmhub.server.core.errors import NotFound
from swarmhub.server.experiments.lifecycle import PUBLIC
from swarmhub.server.metrics.common import share_of
from swarmhub.server.models import Experiment, ExperimentTotal, Team, TeamMember, User, VolunteerTotal
from swarmhub.server.teams.schemas import (
    MEMBERS_LIMIT,
    TEAM_EXPERIMENTS_LIMIT,
    TEAMS_LIMIT,
    ExperimentTeamRow,
    MemberCursor,
    TeamCursor,
    TeamExperiment,
    TeamMemberPublic,
    TeamPage,
    TeamPublic,
    TeamSummary,
    team_path,
)


def get(session: Session, name: str) -> Team:
    """The team called ``name`` (whatever the case), or 404."""
    team = None if "\x00" in name else session.scalar(select(Team).where(func.lower(Team.name) == name.lower()))
    if team is None:
        raise NotFound(f"no team {name!r}")
    return team


def membership(session: Session, user: User) -> TeamMember | None:
    return session.get(TeamMember, user.id)


def team_of(session: Session, user: User) -> Team | None:
    row = membership(session, user)
    return session.get(Team, row.team_id) if row is not None else None


def public_verified(team_id: int | None = None) -> Any:
    """Each user's verified samples over experiments anyone may see (of ``team_id``'s members only, if given)."""
    query = (
        select(VolunteerTotal.user_id, func.sum(VolunteerTotal.verified_samples).label("verified"))
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(PUBLIC)
        .group_by(VolunteerTotal.user_id)
    )
    if team_id is not None:
        query = query.where(VolunteerTotal.user_id.in_(select(TeamMember.user_id).where(TeamMember.team_id == team_id)))
    return query.subquery()


def _standings() -> Any:
    """Each team's members and verified samples, with its sort key: the standings before their order."""
    per_user = public_verified()
    return (
        select(
            Team.id.label("team_id"),
            func.lower(Team.name).label("sort_name"),
            func.count(TeamMember.user_id).label("members"),
            func.coalesce(func.sum(per_user.c.verified), 0).label("verified"),
        )
        .outerjoin(TeamMember, TeamMember.team_id == Team.id)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .group_by(Team.id)
        .subquery()
    )


def ranked(session: Session, limit: int | None, after: TeamCursor | None, before: TeamCursor | None) -> Any:
    """Rows (team, members, verified, sort_name) of the standings in their order: most verified first, then by
    name whatever the case (names are unique so), then by id; ``limit`` of them after ``after``, or the ``limit``
    just before ``before``, or all."""
    s = _standings()
    key = tuple_(s.c.sort_name, s.c.team_id)
    query = select(Team, s.c.members, s.c.verified, s.c.sort_name).join(s, s.c.team_id == Team.id)
    if before is not None:
        query = query.where(
            or_(
                s.c.verified > before.verified,
                and_(s.c.verified == before.verified, key < tuple_(before.sort_name, before.team_id)),
            )
        ).order_by(s.c.verified.asc(), s.c.sort_name.desc(), s.c.team_id.desc())
    else:
        if after is not None:
            query = query.where(
                or_(
                    s.c.verified < after.verified,
                    and_(s.c.verified == after.verified, key > tuple_(after.sort_name, after.team_id)),
                )
            )
        query = query.order_by(s.c.verified.desc(), s.c.sort_name, s.c.team_id)
    if limit is not None:
        query = query.limit(limit)
    rows = session.execute(query).all()
    return rows[::-1] if before is not None else rows


def standings(session: Session) -> list[TeamSummary]:
    """Every team, most verified first (then by name): the hub-wide standings."""
    rows = ranked(session, None, None, None)
    return [summary_of(rank, row.Team, row.members, row.verified) for rank, row in enumerate(rows, 1)]


def standings_page(
    session: Session, limit: int = TEAMS_LIMIT, after: TeamCursor | None = None, before: TeamCursor | None = None
) -> TeamPage:
    """``limit`` teams of the standings: the first, those after the row ``after``, or those before ``before``;
    ``rank`` is the place in the whole standings."""
    rows = ranked(session, limit + 1, after, before)
    more = len(rows) > limit
    if before is not None:
        rows = rows[len(rows) - limit :] if more else rows
        first_rank = before.rank - len(rows)
        earlier = more
    else:
        rows = rows[:limit]
        first_rank = after.rank + 1 if after is not None else 1
        earlier = first_rank > 1
    if not rows:
        return TeamPage(entries=[], next_cursor=None, prev_cursor=None)
    last_rank = first_rank + len(rows) - 1
    later = more if before is None else True  # a page before a row has at least that row after it

    def cursor(rank: int, row: Any) -> str:
        return TeamCursor(rank, int(row.verified), row.sort_name, row.Team.id).encode()

    return TeamPage(
        entries=[summary_of(first_rank + i, row.Team, row.members, row.verified) for i, row in enumerate(rows)],
        next_cursor=cursor(last_rank, rows[-1]) if later else None,
        prev_cursor=cursor(first_rank, rows[0]) if earlier and first_rank > 1 else None,
    )


def summary_of(rank: int, team: Team, members: int, verified: Any) -> TeamSummary:
    return TeamSummary(
        rank=rank,
        name=team.name,
        url=team_path(team.name),
        description=team.description,
        # A founder who hid their profile is not named (their membership would tell that the account exists).
        founder=team.founder.username if team.founder and not team.founder.profile_hidden else None,
        members=int(members),
        verified_samples=int(verified or 0),
        created_at=team.created_at,
    )


def _rank_of(session: Session, team: Team) -> TeamSummary:
    """``team``'s row of the standings, its rank counted (the teams ahead of it), not the standings listed."""
    per_user = public_verified(team.id)
    members, verified = session.execute(
        select(func.count(TeamMember.user_id), func.coalesce(func.sum(per_user.c.verified), 0))
        .select_from(TeamMember)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id)
    ).one()
    s = _standings()
    ahead = session.scalar(
        select(func.count()).where(
            or_(
                s.c.verified > verified,
                and_(
                    s.c.verified == verified,
                    tuple_(s.c.sort_name, s.c.team_id) < tuple_(func.lower(team.name), team.id),
                ),
            )
        )
    )
    return summary_of(int(ahead or 0) + 1, team, members, verified)


def detail(
    session: Session, name: str, members_limit: int = MEMBERS_LIMIT, members_after: MemberCursor | None = None
) -> TeamPublic:
    """A team's page: its row of the standings, a page of its named members (``members_limit`` after
    ``members_after``, most verified first, then the longest in the team), how many hid their profile, and its most
    verified experiments. Reads that team's rows only, whatever the hub's size."""
    team = get(session, name)
    per_user = public_verified(team.id)
    verified = func.coalesce(per_user.c.verified, 0)
    query = (
        select(TeamMember, verified)
        .join(User, User.id == TeamMember.user_id)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id, User.profile_hidden.is_(False))
    )
    if members_after is not None:
        query = query.where(
            or_(
                verified < members_after.verified,
                and_(
                    verified == members_after.verified,
                    tuple_(TeamMember.joined_at, TeamMember.user_id)
                    > tuple_(members_after.joined_at, members_after.user_id),
                ),
            )
        )
    rows = session.execute(
        query.order_by(verified.desc(), TeamMember.joined_at, TeamMember.user_id).limit(members_limit + 1)
    ).all()
    more, rows = len(rows) > members_limit, rows[:members_limit]
    members = [
        TeamMemberPublic(
            username=m.user.username,
            role=m.role,
            founder=m.user_id == team.founder_id,
            joined_at=m.joined_at,
            verified_samples=int(v),
            profile_url=profile_path(m.user.username),
        )
        for m, v in rows
    ]
    hidden = session.scalar(
        select(func.count())
        .select_from(TeamMember)
        .join(User, User.id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id, User.profile_hidden.is_(True))
    )
    experiments = _team_experiments(session, team)
    last = rows[-1] if rows else None
    return TeamPublic(
        **_rank_of(session, team).model_dump(),
        member_list=members,
        members_next_cursor=(
            MemberCursor(int(last[1]), last[0].joined_at, last[0].user_id).encode() if more and last else None
        ),
        hidden_members=int(hidden or 0),
        experiments=experiments[:TEAM_EXPERIMENTS_LIMIT],
        experiments_total=len(experiments),
    )


def _by_experiment_and_team(experiment_ids: Any = None) -> Any:
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


def _team_experiments(session: Session, team: Team) -> list[TeamExperiment]:
    """The team's verified samples in each public experiment its members helped, and its rank there."""
    helped = (
        select(VolunteerTotal.experiment_id)
        .join(TeamMember, TeamMember.user_id == VolunteerTotal.user_id)
        .where(TeamMember.team_id == team.id, VolunteerTotal.verified_samples > 0)
        .distinct()
    )
    return experiments_by_team(session, helped).get(team.id, [])


def experiments_by_team(session: Session, experiment_ids: Any = None) -> dict[int, list[TeamExperiment]]:
    """Every team's verified samples in each public experiment (of ``experiment_ids``, or all) that its members
    helped, its share and its rank among the teams there; by team id, most verified first."""
    by_team = _by_experiment_and_team(experiment_ids).subquery()
    rows = session.execute(
        select(by_team.c.experiment_id, by_team.c.team_id, by_team.c.verified, Experiment, ExperimentTotal)
        .join(Experiment, Experiment.id == by_team.c.experiment_id)
        .join(Team, Team.id == by_team.c.team_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == Experiment.id)
        .where(PUBLIC)
        # the order of experiment_standings within each experiment, ties included: a team's rank is the same there
        .order_by(by_team.c.experiment_id, by_team.c.verified.desc(), func.lower(Team.name))
    ).all()
    grouped: dict[int, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.experiment_id, []).append(row)
    found: dict[int, list[TeamExperiment]] = {}
    for group in grouped.values():
        for rank, row in enumerate(group, 1):
            total = row.ExperimentTotal.verified_samples if row.ExperimentTotal else 0
            found.setdefault(row.team_id, []).append(
                TeamExperiment(
                    slug=row.Experiment.slug,
                    title=row.Experiment.title,
                    url=f"/experiments/{quote(row.Experiment.slug, safe='')}",
                    verified_samples=int(row.verified),
                    share=share_of(int(row.verified), total),
                    rank=rank,
                )
            )
    return {team_id: sorted(rows, key=lambda e: (-e.verified_samples, e.slug)) for team_id, rows in found.items()}


def experiment_standings(session: Session, experiment: Experiment) -> list[ExperimentTeamRow]:
    """The teams of ``experiment`` (the caller checked it may be seen), most verified first."""
    by_team = _by_experiment_and_team([experiment.id]).subquery()
    rows = session.execute(
        select(Team.name, by_team.c.verified, by_team.c.contributors)
        .join(Team, Team.id == by_team.c.team_id)
        .order_by(by_team.c.verified.desc(), func.lower(Team.name))
    ).all()
    totals = session.get(ExperimentTotal, experiment.id)
    total = totals.verified_samples if totals else 0
    return [
        ExperimentTeamRow(
            rank=rank,
            name=name,
            url=team_path(name),
            verified_samples=int(verified),
            contributors=int(contributors),
            share=share_of(int(verified), total),
        )
        for rank, (name, verified, contributors) in enumerate(rows, 1)
    ]
