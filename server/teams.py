"""Teams: volunteers who add up their verified samples under one name (``/teams``, ``/teams/{name}`` and their
JSON under ``/api/teams``), as BOINC and Folding@home volunteers know them.

Rules:
- A volunteer belongs to at most one team at a time (``team_members.user_id`` is the primary key). Creating a team
  makes its creator the founder and an admin member; anyone signed in may join an open team.
- The founder and the team's admins may remove members and promote members to admin; only the founder may remove
  an admin; no one removes the founder (the founder leaves). Acting on someone not in this team is a 404.
- When the founder leaves, the oldest admin (by joining time), else the oldest member, becomes founder. The last
  member to leave deletes the team: an empty team would only hold its name.
- Team names follow the username rules (``accounts.USERNAME_RE``: 2-32 letters, digits, '-', '_'), are unique
  whatever the case, and the name is the team's address. Descriptions are plain text of at most 500 characters.

Credit: a team's figures are the sums of its **current** members' verified samples (``VolunteerTotal``, kept by
the ledger). A member's whole verified contribution counts for the team they are in now, including work done
before they joined; it leaves with them. Only experiments anyone may see (not drafts) count on ``/teams``.
A member who hid their profile is counted but not named, here, on the pages and in the open statistics export
(``/api/stats/teams.{json,csv}``).

Moderation: a hub administrator (``User.is_admin``) may rename any team and remove any team; the founder may rename
their own team too (the name is the team's, and the founder answers for it), the team's admins may not. A new name
passes the rules of a name at creation. Removing a team deletes its memberships and the team, nothing else: the
volunteers' verified samples are the ledger's and stay theirs.

Paging: the standings are pages of at most ``TEAMS_MAX_LIMIT`` teams, in the standings' order, by cursor (as the
leaderboard's): a page's last row leads to the next page, its first row to the previous one.
"""

from __future__ import annotations

import base64
from datetime import datetime
from typing import Annotated, Any, NamedTuple
from urllib.parse import quote

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, field_validator
from sqlalchemy import and_, delete, func, or_, select, tuple_
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from . import exports
from .accounts import USERNAME_RE, is_reserved_username
from .errors import BadRequest, Conflict, Forbidden, NotFound
from .experiments import PUBLIC
from .metrics.common import share_of
from .models import Experiment, ExperimentTotal, Team, TeamMember, User, VolunteerTotal, utcnow
from .models.teams import ADMIN, MEMBER
from .security import StoredText
from .volunteers import profile_path

NAME_MAX = 32
DESCRIPTION_MAX = 500
TEAMS_LIMIT = 100  # teams on a page of the standings unless asked otherwise
TEAMS_MAX_LIMIT = 500


def team_path(name: str) -> str:
    return f"/teams/{quote(name, safe='')}"


class TeamName(BaseModel):
    """A team's name as it is chosen: at creation and when renamed."""

    name: str = Field(min_length=2, max_length=NAME_MAX, description="2-32 letters, digits, '-' or '_'")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not USERNAME_RE.match(value):
            raise ValueError("use 2-32 letters, digits, '-' or '_', starting with a letter or digit")
        return value


class TeamCreate(TeamName):
    description: StoredText = Field(default="", max_length=DESCRIPTION_MAX, description="Plain text")

    @field_validator("description")
    @classmethod
    def _description(cls, value: str) -> str:
        return value.strip()


class MemberAction(BaseModel):
    username: StoredText = Field(min_length=1, max_length=32)


class TeamSummary(BaseModel):
    rank: int = Field(description="Place among all teams by verified samples")
    name: str
    url: str = Field(description="The team's page")
    description: str
    founder: str | None
    members: int
    verified_samples: int = Field(description="Of its current members, over every experiment anyone may see")
    created_at: datetime


class TeamMemberPublic(BaseModel):
    username: str
    role: str = Field(description="member or admin")
    founder: bool
    joined_at: datetime
    verified_samples: int = Field(description="Over every experiment anyone may see")
    profile_url: str


class TeamExperiment(BaseModel):
    slug: str
    title: str
    url: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")
    rank: int = Field(description="The team's place among the teams in this experiment")


class TeamPublic(TeamSummary):
    member_list: list[TeamMemberPublic] = Field(description="Members with a visible profile, most verified first")
    hidden_members: int = Field(description="Members who hid their profile: counted, not named")
    experiments: list[TeamExperiment] = Field(description="Most verified first")


class ExperimentTeamRow(BaseModel):
    rank: int
    name: str
    url: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    contributors: int = Field(description="Members with verified samples in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")


class TeamCursor(NamedTuple):
    """A row of the standings (its rank and sort key): a page starts after it, or ends before it. Clients get it
    as opaque text (base64 of the JSON array) and only hand it back."""

    rank: Annotated[int, Field(ge=1, le=2**62)]
    verified: Annotated[int, Field(ge=0, le=2**62)]
    sort_name: Annotated[StoredText, Field(max_length=NAME_MAX)]
    team_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return base64.urlsafe_b64encode(_CURSOR.dump_json(self)).decode().rstrip("=")

    @staticmethod
    def decode(text: str, field: str = "cursor") -> TeamCursor:
        """The cursor a page returned; a 400 naming ``field`` for anything else."""
        try:
            return _CURSOR.validate_json(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        except (ValueError, ValidationError):  # a base64 error is a ValueError
            raise BadRequest("not a cursor these standings returned", field=field) from None


_CURSOR = TypeAdapter(TeamCursor)


class TeamPage(BaseModel):
    entries: list[TeamSummary]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")
    prev_cursor: str | None = Field(description="Pass as ?before= for the previous page; null on the first page")


class TeamStatsExperiment(BaseModel):
    slug: str
    verified_samples: int = Field(description="Of the team's current members in this experiment")
    share: float = Field(description="Fraction of the experiment's verified samples")
    rank: int = Field(description="The team's place among the teams in this experiment")


class TeamStatsRow(BaseModel):
    rank: int = Field(description="Place among all teams by verified samples")
    name: str
    founder: str | None = Field(description="Null when the founder hid their profile")
    members: int
    member_names: list[str] = Field(description="Members with a visible profile, most verified first")
    hidden_members: int = Field(description="Members who hid their profile: counted, not named")
    verified_samples: int = Field(description="Of its current members, over every experiment anyone may see")
    created_at: datetime
    experiments: list[TeamStatsExperiment] = Field(description="Per experiment anyone may see, most verified first")


class TeamStats(BaseModel):
    generated_at: datetime
    teams: list[TeamStatsRow] = Field(description="Every team, in the standings' order")


# The CSV is long: a team's hub-wide row (experiment empty), then a row per experiment it helped.
CSV_FIELDS = ("team", "experiment", "rank", "members", "verified_samples", "share")


class Membership(BaseModel):
    team: str | None = Field(description="The team the caller is in now; null when none")
    role: str | None


# ---- reads


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


def _public_verified() -> Any:
    """Each user's verified samples over experiments anyone may see."""
    return (
        select(VolunteerTotal.user_id, func.sum(VolunteerTotal.verified_samples).label("verified"))
        .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
        .where(PUBLIC)
        .group_by(VolunteerTotal.user_id)
        .subquery()
    )


def _standings() -> Any:
    """Each team's members and verified samples, with its sort key: the standings before their order."""
    per_user = _public_verified()
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


def _ranked(session: Session, limit: int | None, after: TeamCursor | None, before: TeamCursor | None) -> Any:
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
    rows = _ranked(session, None, None, None)
    return [_summary(rank, row.Team, row.members, row.verified) for rank, row in enumerate(rows, 1)]


def standings_page(
    session: Session, limit: int = TEAMS_LIMIT, after: TeamCursor | None = None, before: TeamCursor | None = None
) -> TeamPage:
    """``limit`` teams of the standings: the first, those after the row ``after``, or those before ``before``;
    ``rank`` is the place in the whole standings."""
    rows = _ranked(session, limit + 1, after, before)
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
        entries=[_summary(first_rank + i, row.Team, row.members, row.verified) for i, row in enumerate(rows)],
        next_cursor=cursor(last_rank, rows[-1]) if later else None,
        prev_cursor=cursor(first_rank, rows[0]) if earlier and first_rank > 1 else None,
    )


def _summary(rank: int, team: Team, members: int, verified: Any) -> TeamSummary:
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


def _members(session: Session, team_id: int | None = None) -> dict[int, list[Any]]:
    """Each team's members (or ``team_id``'s) with their verified samples, most verified first, then the longest
    in the team: (TeamMember, verified) rows by team id."""
    per_user = _public_verified()
    verified = func.coalesce(per_user.c.verified, 0)
    query = (
        select(TeamMember, verified)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .order_by(TeamMember.team_id, verified.desc(), TeamMember.joined_at)
    )
    if team_id is not None:
        query = query.where(TeamMember.team_id == team_id)
    grouped: dict[int, list[Any]] = {}
    for member, member_verified in session.execute(query).all():
        grouped.setdefault(member.team_id, []).append((member, int(member_verified)))
    return grouped


def _named(rows: list[Any]) -> list[Any]:
    """The members anyone may see named: a member who hid their profile is counted, never named (their
    membership would tell that the account exists)."""
    return [(member, verified) for member, verified in rows if not member.user.profile_hidden]


def detail(session: Session, name: str) -> TeamPublic:
    team = get(session, name)
    summary = next(s for s in standings(session) if s.name == team.name)
    rows = _members(session, team.id).get(team.id, [])
    members = [
        TeamMemberPublic(
            username=m.user.username,
            role=m.role,
            founder=m.user_id == team.founder_id,
            joined_at=m.joined_at,
            verified_samples=v,
            profile_url=profile_path(m.user.username),
        )
        for m, v in _named(rows)
    ]
    return TeamPublic(
        **summary.model_dump(),
        member_list=members,
        hidden_members=len(rows) - len(members),
        experiments=_team_experiments(session, team),
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
    return _experiments_by_team(session, helped).get(team.id, [])


def _experiments_by_team(session: Session, experiment_ids: Any = None) -> dict[int, list[TeamExperiment]]:
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


def stats(session: Session) -> TeamStats:
    """The open statistics export: every team as the standings and the team pages count it (the same functions),
    with the members anyone may see named and the others counted, and its standing in each public experiment."""
    members = _members(session)
    experiments = _experiments_by_team(session)
    rows = []
    for rank, row in enumerate(_ranked(session, None, None, None), 1):
        team, listed = row.Team, members.get(row.Team.id, [])
        named = [member.user.username for member, _ in _named(listed)]
        summary = _summary(rank, team, row.members, row.verified)
        rows.append(
            TeamStatsRow(
                rank=rank,
                name=team.name,
                founder=summary.founder,
                members=summary.members,
                member_names=named,
                hidden_members=len(listed) - len(named),
                verified_samples=summary.verified_samples,
                created_at=team.created_at,
                experiments=[
                    TeamStatsExperiment(slug=e.slug, verified_samples=e.verified_samples, share=e.share, rank=e.rank)
                    for e in experiments.get(team.id, [])
                ],
            )
        )
    return TeamStats(generated_at=utcnow(), teams=rows)


def stats_csv(data: TeamStats) -> str:
    def rows() -> Any:
        for team in data.teams:
            yield (team.name, "", team.rank, team.members, team.verified_samples, "")
            for e in team.experiments:
                yield (team.name, e.slug, e.rank, team.members, e.verified_samples, e.share)

    return exports.csv_text(CSV_FIELDS, rows())


def stats_bodies(session: Session) -> tuple[bytes, str]:
    """The export's JSON and CSV, from one read so that they agree."""
    data = stats(session)
    return data.model_dump_json().encode(), stats_csv(data)


# ---- changes (the caller's transaction; nothing here commits)


def create(session: Session, user: User, data: TeamCreate) -> Team:
    if is_reserved_username(data.name):
        raise Conflict("that name is reserved for the swarm peers of the server", field="name")
    current = team_of(session, user)
    if current is not None:
        raise Conflict(f"you are in team {current.name!r}: leave it first", field="name")
    _check_name(session, data.name)
    team = Team(name=data.name, description=data.description, founder_id=user.id, creator_id=user.id)
    # The checks above read before writing: two requests at once can both pass them, and the database's unique
    # keys (lower(name), one membership per user) then refuse the second, as a 409 and not a 500.
    try:
        with session.begin_nested():
            session.add(team)
            session.flush()
            session.add(TeamMember(user_id=user.id, team_id=team.id, role=ADMIN))
    except IntegrityError:
        raise Conflict("that team name is taken, or you joined a team meanwhile", field="name") from None
    return team


def join(session: Session, user: User, team: Team) -> TeamMember:
    current = membership(session, user)
    if current is not None:
        if current.team_id == team.id:
            return current
        other = session.get(Team, current.team_id)
        raise Conflict(f"you are in team {other.name if other else '?'!r}: leave it first", field="team")
    row = TeamMember(user_id=user.id, team_id=team.id, role=MEMBER)
    try:
        with session.begin_nested():  # a join of another team at the same moment: the primary key refuses one
            session.add(row)
    except IntegrityError:
        raise Conflict("you joined a team meanwhile: leave it first", field="team") from None
    return row


def leave(session: Session, user: User, team: Team) -> None:
    """``user`` leaves ``team``; the founder's place passes on, and the last one out deletes the team."""
    row = membership(session, user)
    if row is None or row.team_id != team.id:
        raise Conflict(f"you are not in team {team.name!r}", field="team")
    _remove(session, team, row)


def _remove(session: Session, team: Team, row: TeamMember) -> None:
    session.delete(row)
    session.flush()
    if row.user_id != team.founder_id:
        return
    successor = session.scalar(
        select(TeamMember)
        .where(TeamMember.team_id == team.id)
        .order_by((TeamMember.role == ADMIN).desc(), TeamMember.joined_at, TeamMember.user_id)
        .limit(1)
    )
    if successor is None:
        session.execute(delete(Team).where(Team.id == team.id))
        session.expunge(team)
        return
    successor.role = ADMIN
    team.founder_id = successor.user_id
    session.flush()
    session.refresh(team)


def _manager(session: Session, team: Team, actor: User) -> TeamMember:
    """The acting member when they may manage ``team`` (founder or admin); 403 otherwise."""
    row = membership(session, actor)
    if row is None or row.team_id != team.id or (row.role != ADMIN and actor.id != team.founder_id):
        raise Forbidden(f"only the founder and the admins of team {team.name!r} may do this")
    return row


def _member_named(session: Session, team: Team, username: str) -> TeamMember:
    row = (
        session.scalar(
            select(TeamMember)
            .join(User, User.id == TeamMember.user_id)
            .where(TeamMember.team_id == team.id, User.username == username)
        )
        if "\x00" not in username
        else None
    )
    if row is None:
        raise NotFound(f"{username!r} is not in team {team.name!r}", field="username")
    return row


def remove_member(session: Session, actor: User, team: Team, username: str) -> None:
    """The founder or an admin removes someone; only the founder removes an admin; no one removes the founder."""
    _manager(session, team, actor)
    target = _member_named(session, team, username)
    if target.user_id == actor.id:
        raise Conflict("to leave your own team, use leave", field="username")
    if target.user_id == team.founder_id:
        raise Forbidden("no one removes the founder", field="username")
    if target.role == ADMIN and actor.id != team.founder_id:
        raise Forbidden("only the founder removes an admin", field="username")
    _remove(session, team, target)


def promote(session: Session, actor: User, team: Team, username: str) -> None:
    _manager(session, team, actor)
    _member_named(session, team, username).role = ADMIN
    session.flush()


def can_manage(session: Session, team: Team, user: User | None) -> bool:
    if user is None:
        return False
    row = membership(session, user)
    return row is not None and row.team_id == team.id and (row.role == ADMIN or user.id == team.founder_id)


# ---- moderation


def _check_name(session: Session, name: str, team: Team | None = None) -> None:
    """A name ``team`` may take (a new team: ``None``): not reserved, and no other team's whatever the case."""
    if is_reserved_username(name):
        raise Conflict("that name is reserved for the swarm peers of the server", field="name")
    taken = select(Team.id).where(func.lower(Team.name) == name.lower())
    if team is not None:
        taken = taken.where(Team.id != team.id)
    if session.scalar(taken) is not None:
        raise Conflict("that team name is taken", field="name")


def can_rename(team: Team, user: User | None) -> bool:
    """A hub administrator, or the team's founder."""
    return user is not None and (user.is_admin or user.id == team.founder_id)


def check_rename(team: Team, user: User) -> None:
    if not can_rename(team, user):
        raise Forbidden(f"only the founder of team {team.name!r} and the hub's administrators may rename it")


def can_remove(user: User | None) -> bool:
    """A hub administrator only: a team ends otherwise when its last member leaves."""
    return user is not None and user.is_admin


def rename(session: Session, actor: User, team: Team, data: TeamName) -> Team:
    """The founder or a hub administrator gives ``team`` a new name (its address changes with it); 403 for
    anyone else, 409 for a name taken whatever the case or reserved. A change of case alone is allowed."""
    check_rename(team, actor)
    _check_name(session, data.name, team)
    try:
        with session.begin_nested():  # another team taking the name meanwhile: the unique index refuses one
            team.name = data.name
            session.flush()
    except IntegrityError:
        session.refresh(team)
        raise Conflict("that team name is taken", field="name") from None
    return team


def remove_team(session: Session, actor: User, team: Team) -> None:
    """A hub administrator removes ``team``: its memberships and the team go; every volunteer's verified samples
    stay theirs (they are the ledger's, not the team's). 403 for anyone else, the team's founder included."""
    if not can_remove(actor):
        raise Forbidden("only the hub's administrators may remove a team")
    session.execute(delete(TeamMember).where(TeamMember.team_id == team.id))
    session.execute(delete(Team).where(Team.id == team.id))
    session.expunge(team)
