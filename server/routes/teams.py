"""JSON about teams: the hub-wide standings, one team, an experiment's teams; creating, joining and leaving a team,
and a team's founder and admins managing its members. Changes need a bearer token (a volunteer token is enough:
teams change no experiment)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from .. import experiments, quotas, teams
from ..deps import DB, AppSettings, CurrentUser, OptionalUser
from ..errors import documented
from ..ratelimit import check_account, limited

router = APIRouter(prefix="/api", tags=["teams"], responses=documented(400, 401, 403, 404, 409, 429))


@router.get("/teams", response_model=list[teams.TeamSummary])
def list_teams(session: DB) -> list[teams.TeamSummary]:
    """Every team, most verified samples first: the sums of its current members' verified samples."""
    return teams.standings(session)


@router.post("/teams", response_model=teams.TeamPublic, status_code=201, dependencies=[limited("team-create")])
def create_team(
    body: teams.TeamCreate, session: DB, user: CurrentUser, settings: AppSettings, request: Request
) -> teams.TeamPublic:
    """Create a team and become its founder. Refused: a name taken whatever the case (409), while in another team
    (409), more than ``SWARMHUB_QUOTA_TEAMS_PER_DAY`` teams per account a day or too many attempts (429)."""
    check_account(request, "team-create", user)
    quotas.check_team_create(session, settings, user)
    team = teams.create(session, user, body)
    return teams.detail(session, team.name)


@router.get("/teams/{slug}", response_model=teams.TeamPublic)
def get_team(slug: str, session: DB) -> teams.TeamPublic:
    return teams.detail(session, slug)


@router.post("/teams/{slug}/join", response_model=teams.Membership)
def join_team(slug: str, session: DB, user: CurrentUser) -> teams.Membership:
    """Join a team; 409 while in another (leave it first)."""
    team = teams.get(session, slug)
    row = teams.join(session, user, team)
    return teams.Membership(team=team.name, role=row.role)


@router.post("/teams/{slug}/leave", response_model=teams.Membership)
def leave_team(slug: str, session: DB, user: CurrentUser) -> teams.Membership:
    """Leave a team; a founder's place passes to the oldest admin, else the oldest member; the last one out
    deletes the team."""
    teams.leave(session, user, teams.get(session, slug))
    return teams.Membership(team=None, role=None)


@router.delete("/teams/{slug}/members/{username}", status_code=204)
def remove_member(slug: str, username: str, session: DB, user: CurrentUser) -> Response:
    """The founder or an admin removes a member (only the founder removes an admin); 403 for anyone else."""
    teams.remove_member(session, user, teams.get(session, slug), username)
    return Response(status_code=204)


@router.post("/teams/{slug}/admins", status_code=204)
def promote_member(slug: str, body: teams.MemberAction, session: DB, user: CurrentUser) -> Response:
    """The founder or an admin makes a member an admin; 403 for anyone else."""
    teams.promote(session, user, teams.get(session, slug), body.username)
    return Response(status_code=204)


@router.get("/experiments/{slug}/teams", response_model=list[teams.ExperimentTeamRow])
def experiment_teams(slug: str, session: DB, user: OptionalUser) -> list[teams.ExperimentTeamRow]:
    """The experiment's teams, by their current members' verified samples in it."""
    return teams.experiment_standings(session, experiments.get_visible(session, slug, user))
