"""Teams: lookups, the hub-wide standings and a team's page (its row of them, its members); the standings per
experiment are in :mod:`.per_experiment`, the open statistics export in :mod:`.export`."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from swarmhub.server.community.volunteers import profile_path
from swarmhub.server.core.errors import NotFound
from swarmhub.server.experiments.lifecycle import PUBLIC
from swarmhub.server.models import Experiment, Team, TeamMember, User, VolunteerTotal
from swarmhub.server.teams.per_experiment import team_experiments_page, team_experiments_total
from swarmhub.server.teams.schemas import (
    MEMBERS_LIMIT,
    TEAM_EXPERIMENTS_LIMIT,
    TEAMS_LIMIT,
    MemberCursor,
    Page,
    TeamCursor,
    TeamExperimentCursor,
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
    session: Session,
    name: str,
    members_limit: int = MEMBERS_LIMIT,
    members_after: MemberCursor | None = None,
    experiments_limit: int = TEAM_EXPERIMENTS_LIMIT,
    experiments_after: TeamExperimentCursor | None = None,
) -> TeamPublic:
    """A team's page: its row of the standings, a page of its named members (:func:`members_page`), how many hid
    their profile, and a page of its experiments (:func:`.per_experiment.team_experiments_page`). Reads that team's
    rows only, whatever the hub's size."""
    team = get(session, name)
    members = members_page(session, team, members_limit, members_after)
    hidden = session.scalar(
        select(func.count())
        .select_from(TeamMember)
        .join(User, User.id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id, User.profile_hidden.is_(True))
    )
    experiments = team_experiments_page(session, team, experiments_limit, experiments_after)
    return TeamPublic(
        **_rank_of(session, team).model_dump(),
        member_list=members.entries,
        members_next_cursor=members.next_cursor,
        hidden_members=int(hidden or 0),
        experiments=experiments.entries,
        experiments_next_cursor=experiments.next_cursor,
        experiments_total=team_experiments_total(session, team),
    )


def members_page(
    session: Session, team: Team, limit: int = MEMBERS_LIMIT, after: MemberCursor | None = None
) -> Page[TeamMemberPublic]:
    """``limit`` of ``team``'s members who show their profile, most verified first (then the longest in the team),
    after the row ``after``: a member who hid their profile is counted on the team's page, never named."""
    per_user = public_verified(team.id)
    verified = func.coalesce(per_user.c.verified, 0)
    query = (
        select(TeamMember, verified)
        .join(User, User.id == TeamMember.user_id)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id, User.profile_hidden.is_(False))
    )
    if after is not None:
        query = query.where(
            or_(
                verified < after.verified,
                and_(
                    verified == after.verified,
                    tuple_(TeamMember.joined_at, TeamMember.user_id) > tuple_(after.joined_at, after.user_id),
                ),
            )
        )
    rows = session.execute(
        query.order_by(verified.desc(), TeamMember.joined_at, TeamMember.user_id).limit(limit + 1)
    ).all()
    more, rows = len(rows) > limit, rows[:limit]
    entries = [
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
    last = rows[-1] if rows else None
    next_cursor = MemberCursor(int(last[1]), last[0].joined_at, last[0].user_id).encode() if more and last else None
    return Page(entries=entries, next_cursor=next_cursor)
