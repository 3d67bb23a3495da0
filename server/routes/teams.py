"""JSON about teams: the hub-wide standings, one team, its members and its experiments, an experiment's teams (each
list in pages by cursor, as the leaderboard's: ``limit``, ``cursor``, ``Next-Cursor``); creating, joining and
leaving a team, a team's founder and admins managing its members, renaming and removing a team (moderation), and
the open statistics export of every team (``/api/stats/teams.json`` and ``.csv``). Changes need a bearer token (a
volunteer token is enough: teams change no experiment)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Query, Request, Response

from swarmhub.server import experiments, teams
from swarmhub.server.accounts import quotas
from swarmhub.server.community import exports
from swarmhub.server.core.errors import BadRequest, documented
from swarmhub.server.http.deps import DB, AppSettings, CurrentUser, OptionalUser
from swarmhub.server.http.paging import NEXT_PAGE, link_next
from swarmhub.server.http.ratelimit import check_account, limited
from swarmhub.server.services import services

router = APIRouter(prefix="/api", tags=["teams"], responses=documented(400, 401, 403, 404, 409, 429))

Limit = Annotated[int, Query(ge=1, le=teams.TEAMS_MAX_LIMIT, description="Teams on the page")]
After = Annotated[str | None, Query(max_length=200, description="The Next-Cursor of the previous page")]
Before = Annotated[str | None, Query(max_length=200, description="The Prev-Cursor of the next page")]
MembersLimit = Annotated[
    int, Query(ge=1, le=teams.MEMBERS_MAX_LIMIT, description="Named members on the page of the team's members")
]
MembersAfter = Annotated[
    str | None, Query(max_length=200, description="The members_next_cursor of the previous page of members")
]
ExperimentsLimit = Annotated[
    int, Query(ge=1, le=teams.TEAM_EXPERIMENTS_MAX_LIMIT, description="Experiments on the page of the team's ones")
]
ExperimentsAfter = Annotated[
    str | None, Query(max_length=200, description="The experiments_next_cursor of the previous page of experiments")
]


def team_detail(
    session: DB,
    slug: str,
    members_limit: int,
    members_cursor: str | None,
    experiments_limit: int = teams.TEAM_EXPERIMENTS_LIMIT,
    experiments_cursor: str | None = None,
) -> teams.TeamPublic:
    members_after = teams.MemberCursor.decode(members_cursor) if members_cursor is not None else None
    experiments_after = (
        teams.TeamExperimentCursor.decode(experiments_cursor) if experiments_cursor is not None else None
    )
    return teams.detail(session, slug, members_limit, members_after, experiments_limit, experiments_after)


def next_page(request: Request, response: Response, limit: int, page: teams.Page[Any]) -> list[Any]:
    """A page's rows as the body, and the way to the next page as the leaderboard gives it: the ``Next-Cursor``
    header and ``Link`` (rel="next"), both absent on the last page. Headers, not fields: the body stays a list."""
    link_next(request, response, limit, page.next_cursor)
    return page.entries


def standings_page(limit: int, cursor: str | None, before: str | None, session: DB) -> teams.TeamPage:
    """The page the query asks for: the first, after ``cursor``, or before ``before`` (not both: 400)."""
    if cursor is not None and before is not None:
        raise BadRequest("give cursor or before, not both", field="before")
    after = teams.TeamCursor.decode(cursor) if cursor is not None else None
    ahead = teams.TeamCursor.decode(before, "before") if before is not None else None
    return teams.standings_page(session, limit, after=after, before=ahead)


@router.get(
    "/teams",
    response_model=list[teams.TeamSummary],
    responses={
        200: {
            "headers": {
                "Next-Cursor": {"description": "Pass as ?cursor= for the next page; absent on the last page"},
                "Prev-Cursor": {"description": "Pass as ?before= for the previous page; absent on the first page"},
                "Link": {"description": 'The next and previous pages\' addresses, rel="next" and rel="prev"'},
            }
        }
    },
)
def list_teams(
    session: DB,
    request: Request,
    response: Response,
    limit: Limit = teams.TEAMS_LIMIT,
    cursor: After = None,
    before: Before = None,
) -> list[teams.TeamSummary]:
    """A page of the teams, most verified samples first: the sums of their current members' verified samples;
    ``rank`` is the place in the whole standings. Page on with the ``Next-Cursor`` header (back with
    ``Prev-Cursor``), as the leaderboard pages."""
    page = standings_page(limit, cursor, before, session)
    links = []
    for header, param, value, rel in (
        ("Next-Cursor", "cursor", page.next_cursor, "next"),
        ("Prev-Cursor", "before", page.prev_cursor, "prev"),
    ):
        if value is not None:
            # Headers, not fields: the body stays the list that scripts already read.
            response.headers[header] = value
            links.append(f'<{request.url.path}?{urlencode({"limit": limit, param: value})}>; rel="{rel}"')
    if links:
        response.headers["Link"] = ", ".join(links)
    return page.entries


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
def get_team(
    slug: str,
    session: DB,
    members_limit: MembersLimit = teams.MEMBERS_LIMIT,
    members_cursor: MembersAfter = None,
    experiments_limit: ExperimentsLimit = teams.TEAM_EXPERIMENTS_LIMIT,
    experiments_cursor: ExperimentsAfter = None,
) -> teams.TeamPublic:
    """The team, a page of its named members and a page of its experiments (``members_next_cursor`` and
    ``experiments_next_cursor`` lead to the next ones, here or as ``?cursor=`` of ``/members`` and ``/experiments``)."""
    return team_detail(session, slug, members_limit, members_cursor, experiments_limit, experiments_cursor)


@router.get("/teams/{slug}/members", response_model=list[teams.TeamMemberPublic], responses=NEXT_PAGE)
def team_members(
    slug: str,
    session: DB,
    request: Request,
    response: Response,
    limit: MembersLimit = teams.MEMBERS_LIMIT,
    cursor: After = None,
) -> list[teams.TeamMemberPublic]:
    """A page of the team's members who show their profile, most verified first (then the longest in the team);
    those who hid it are counted on the team (``hidden_members``), never named. Page on with ``Next-Cursor``."""
    after = teams.MemberCursor.decode(cursor, "cursor") if cursor is not None else None
    return next_page(request, response, limit, teams.members_page(session, teams.get(session, slug), limit, after))


@router.get("/teams/{slug}/experiments", response_model=list[teams.TeamExperiment], responses=NEXT_PAGE)
def team_experiments(
    slug: str,
    session: DB,
    request: Request,
    response: Response,
    limit: ExperimentsLimit = teams.TEAM_EXPERIMENTS_LIMIT,
    cursor: After = None,
) -> list[teams.TeamExperiment]:
    """A page of the public experiments the team's members helped, most verified first (then by slug), with the
    team's share and its rank among the experiment's teams. Page on with ``Next-Cursor``."""
    after = teams.TeamExperimentCursor.decode(cursor, "cursor") if cursor is not None else None
    page = teams.team_experiments_page(session, teams.get(session, slug), limit, after)
    return next_page(request, response, limit, page)


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


@router.post("/teams/{slug}/rename", response_model=teams.TeamPublic)
def rename_team(slug: str, body: teams.TeamName, session: DB, user: CurrentUser) -> teams.TeamPublic:
    """Give the team a new name (and so a new address): its founder or a hub administrator; 403 for anyone else
    (the team's admins included), 409 for a name taken whatever the case. The same name rules as at creation."""
    team = teams.rename(session, user, teams.get(session, slug), body)
    return teams.detail(session, team.name)


@router.delete("/teams/{slug}", status_code=204)
def remove_team(slug: str, session: DB, user: CurrentUser) -> Response:
    """Remove the team and its memberships: a hub administrator only (403 for anyone else, its founder
    included). The members' verified samples stay theirs."""
    teams.remove_team(session, user, teams.get(session, slug))
    return Response(status_code=204)


@router.get(
    "/stats/teams.json",
    response_class=Response,
    responses={
        **exports.RESPONSES,
        200: {**exports.RESPONSES[200], "model": teams.TeamStats, "description": "Every team"},
    },
)
def team_stats_json(request: Request, session: DB) -> Response:
    """Every team as the standings count it: members (named where their profile is visible), verified samples
    hub-wide and per public experiment with its share and rank there. Gzipped when the client accepts it;
    rebuilt at most every ``SWARMHUB_STATS_CACHE_SECONDS`` (per server process)."""
    return exports.serve(request, services(request.app).team_stats.get(session, "json"))


@router.get(
    "/stats/teams.csv",
    response_class=Response,
    responses=exports.csv_responses(
        "team,experiment,rank,members,verified_samples,share: per team a hub-wide row (experiment and share "
        "empty), then a row per public experiment it helped"
    ),
)
def team_stats_csv(request: Request, session: DB) -> Response:
    """The JSON export's figures as CSV (RFC 4180, a header row first; no member names). A text cell that a
    spreadsheet would run as a formula is prefixed with ``'``."""
    return exports.serve(request, services(request.app).team_stats.get(session, "csv"))


@router.get("/experiments/{slug}/teams", response_model=list[teams.ExperimentTeamRow], responses=NEXT_PAGE)
def experiment_teams(
    slug: str,
    session: DB,
    user: OptionalUser,
    request: Request,
    response: Response,
    limit: Limit = teams.TEAMS_LIMIT,
    cursor: After = None,
) -> list[teams.ExperimentTeamRow]:
    """A page of the experiment's teams, by their current members' verified samples in it; ``rank`` is the place
    among all of them. Page on with ``Next-Cursor``, as the leaderboard pages."""
    after = teams.ExperimentTeamCursor.decode(cursor) if cursor is not None else None
    experiment = experiments.get_visible(session, slug, user)
    return next_page(request, response, limit, teams.experiment_standings_page(session, experiment, limit, after))
