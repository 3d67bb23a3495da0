"""Teams: founding, joining, leaving, managing members, and moderation (renaming, removing)."""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from swarmhub.server.accounts.users import is_reserved_username
from swarmhub.server.core.errors import Conflict, Forbidden, NotFound
from swarmhub.server.models import Team, TeamFounding, TeamMember, User
from swarmhub.server.models.teams import ADMIN, MEMBER
from swarmhub.server.teams.schemas import TeamCreate, TeamName
from swarmhub.server.teams.standings import membership, team_of


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
            session.add(TeamFounding(creator_id=user.id, created_at=team.created_at))
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
