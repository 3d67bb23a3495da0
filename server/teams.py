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
A member who hid their profile is counted but not named.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, Field, field_validator
from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .accounts import USERNAME_RE, is_reserved_username
from .errors import Conflict, Forbidden, NotFound
from .experiments import PUBLIC
from .metrics.common import share_of
from .models import Experiment, ExperimentTotal, Team, TeamMember, User, VolunteerTotal
from .models.teams import ADMIN, MEMBER
from .security import StoredText
from .volunteers import profile_path

NAME_MAX = 32
DESCRIPTION_MAX = 500


def team_path(name: str) -> str:
    return f"/teams/{quote(name, safe='')}"


class TeamCreate(BaseModel):
    name: str = Field(min_length=2, max_length=NAME_MAX, description="2-32 letters, digits, '-' or '_'")
    description: StoredText = Field(default="", max_length=DESCRIPTION_MAX, description="Plain text")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not USERNAME_RE.match(value):
            raise ValueError("use 2-32 letters, digits, '-' or '_', starting with a letter or digit")
        return value

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


def standings(session: Session) -> list[TeamSummary]:
    """Every team, most verified first (then by name): the hub-wide standings."""
    per_user = _public_verified()
    verified = func.coalesce(func.sum(per_user.c.verified), 0)
    rows = session.execute(
        select(Team, func.count(TeamMember.user_id), verified)
        .outerjoin(TeamMember, TeamMember.team_id == Team.id)
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .group_by(Team.id)
        .order_by(verified.desc(), func.lower(Team.name))
    ).all()
    return [_summary(rank, team, members, verified) for rank, (team, members, verified) in enumerate(rows, 1)]


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


def detail(session: Session, name: str) -> TeamPublic:
    team = get(session, name)
    summary = next(s for s in standings(session) if s.name == team.name)
    per_user = _public_verified()
    rows = session.execute(
        select(TeamMember, func.coalesce(per_user.c.verified, 0))
        .outerjoin(per_user, per_user.c.user_id == TeamMember.user_id)
        .where(TeamMember.team_id == team.id)
        .order_by(func.coalesce(per_user.c.verified, 0).desc(), TeamMember.joined_at)
    ).all()
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
        if not m.user.profile_hidden
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
    by_team = _by_experiment_and_team(helped).subquery()
    rows = session.execute(
        select(by_team.c.experiment_id, by_team.c.team_id, by_team.c.verified, Experiment, ExperimentTotal)
        .join(Experiment, Experiment.id == by_team.c.experiment_id)
        .outerjoin(ExperimentTotal, ExperimentTotal.experiment_id == Experiment.id)
        .where(PUBLIC)
    ).all()
    grouped: dict[int, list[Any]] = {}
    for row in rows:
        grouped.setdefault(row.experiment_id, []).append(row)
    found = []
    for group in grouped.values():
        group.sort(key=lambda r: -int(r.verified))
        for rank, row in enumerate(group, 1):
            if row.team_id != team.id:
                continue
            total = row.ExperimentTotal.verified_samples if row.ExperimentTotal else 0
            found.append(
                TeamExperiment(
                    slug=row.Experiment.slug,
                    title=row.Experiment.title,
                    url=f"/experiments/{quote(row.Experiment.slug, safe='')}",
                    verified_samples=int(row.verified),
                    share=share_of(int(row.verified), total),
                    rank=rank,
                )
            )
    return sorted(found, key=lambda e: (-e.verified_samples, e.slug))


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


# ---- changes (the caller's transaction; nothing here commits)


def create(session: Session, user: User, data: TeamCreate) -> Team:
    if is_reserved_username(data.name):
        raise Conflict("that name is reserved for the swarm peers of the server", field="name")
    current = team_of(session, user)
    if current is not None:
        raise Conflict(f"you are in team {current.name!r}: leave it first", field="name")
    if session.scalar(select(Team.id).where(func.lower(Team.name) == data.name.lower())) is not None:
        raise Conflict("that team name is taken", field="name")
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
