"""Team pages: ``/teams`` (the standings, in pages, and the form to found one) and ``/teams/{name}`` (members,
standings per experiment, join and leave, the founder's and admins' member controls, and the moderation controls:
rename for the founder and hub administrators, remove for hub administrators). Forms post back with a CSRF token."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from swarmhub.server import teams
from swarmhub.server.accounts import quotas
from swarmhub.server.core.errors import AppError
from swarmhub.server.http.deps import CSRF, DB, AppSettings, PageUser, RequiredPageUser
from swarmhub.server.http.ratelimit import check_account, limited
from swarmhub.server.http.views import render
from swarmhub.server.routes.page_helpers import WebSess, form_errors, router, see_other
from swarmhub.server.routes.teams import (
    After,
    Before,
    ExperimentsAfter,
    ExperimentsLimit,
    Limit,
    MembersAfter,
    MembersLimit,
    standings_page,
    team_detail,
)


def _list(request: Request, session: DB, user: Any, web: Any, **extra: Any) -> Response:
    status_code = extra.pop("status_code", 200)
    page = extra.pop("page", None) or teams.standings_page(session)
    context = {
        "standings": page.entries,
        "page": page,
        "limit": extra.pop("limit", teams.TEAMS_LIMIT),
        "mine": teams.team_of(session, user) if user is not None else None,
        "values": {},
        "errors": {},
        **extra,
    }
    return render(request, "teams.html", context, user=user, web=web, status_code=status_code)


@router.get("/teams")
def teams_page(
    request: Request,
    session: DB,
    user: PageUser,
    web: WebSess,
    limit: Limit = teams.TEAMS_LIMIT,
    cursor: After = None,
    before: Before = None,
) -> Response:
    """A page of the standings (as ``GET /api/teams``), with links to the next and previous pages."""
    page = standings_page(limit, cursor, before, session)
    return _list(request, session, user, web, page=page, limit=limit)


@router.post("/teams", dependencies=[CSRF, limited("team-create")])
async def create_team(
    request: Request, session: DB, settings: AppSettings, user: RequiredPageUser, web: WebSess
) -> Response:
    form = await request.form()
    values = {"name": str(form.get("name", "")), "description": str(form.get("description", ""))}
    try:
        data = teams.TeamCreate.model_validate(values)
        check_account(request, "team-create", user)
        quotas.check_team_create(session, settings, user)
        team = teams.create(session, user, data)
    except ValidationError as exc:
        return _list(request, session, user, web, values=values, errors=form_errors(exc), status_code=422)
    except AppError as exc:
        errors = {exc.field or "form": exc.message}
        return _list(request, session, user, web, values=values, errors=errors, status_code=exc.status_code)
    return see_other(teams.team_path(team.name))


@router.get("/teams/{slug}")
def team_page(
    request: Request,
    slug: str,
    session: DB,
    user: PageUser,
    web: WebSess,
    members_limit: MembersLimit = teams.MEMBERS_LIMIT,
    members_cursor: MembersAfter = None,
    experiments_limit: ExperimentsLimit = teams.TEAM_EXPERIMENTS_LIMIT,
    experiments_cursor: ExperimentsAfter = None,
) -> Response:
    """A page of the team's members and one of its experiments (as ``GET /api/teams/{name}``), each with a link to
    its next page."""
    detail = team_detail(session, slug, members_limit, members_cursor, experiments_limit, experiments_cursor)
    limits = {"members_limit": members_limit, "experiments_limit": experiments_limit}
    return _team(request, slug, session, user, web, detail=detail, **limits)


def _team(request: Request, slug: str, session: DB, user: Any, web: Any, **extra: Any) -> Response:
    status_code = extra.pop("status_code", 200)
    team = teams.get(session, slug)
    row = teams.membership(session, user) if user is not None else None
    context = {
        "team": extra.pop("detail", None) or teams.detail(session, slug),
        "members_limit": extra.pop("members_limit", teams.MEMBERS_LIMIT),
        "experiments_limit": extra.pop("experiments_limit", teams.TEAM_EXPERIMENTS_LIMIT),
        "member": row is not None and row.team_id == team.id,
        "elsewhere": row is not None and row.team_id != team.id,
        "can_manage": teams.can_manage(session, team, user),
        "is_founder": user is not None and user.id == team.founder_id,
        "can_rename": teams.can_rename(team, user),
        "can_remove": teams.can_remove(user),
        "values": {},
        "errors": {},
        **extra,
    }
    return render(request, "team.html", context, user=user, web=web, status_code=status_code)


@router.post("/teams/{slug}/join", dependencies=[CSRF])
def join_team(slug: str, session: DB, user: RequiredPageUser) -> Response:
    team = teams.get(session, slug)
    teams.join(session, user, team)
    return see_other(teams.team_path(team.name))


@router.post("/teams/{slug}/members/{username}/remove", dependencies=[CSRF])
def remove_member(slug: str, username: str, session: DB, user: RequiredPageUser) -> Response:
    team = teams.get(session, slug)
    teams.remove_member(session, user, team, username)
    return see_other(teams.team_path(team.name))


@router.post("/teams/{slug}/members/{username}/promote", dependencies=[CSRF])
def promote_member(slug: str, username: str, session: DB, user: RequiredPageUser) -> Response:
    team = teams.get(session, slug)
    teams.promote(session, user, team, username)
    return see_other(teams.team_path(team.name))


@router.post("/teams/{slug}/rename", dependencies=[CSRF])
async def rename_team(request: Request, slug: str, session: DB, user: RequiredPageUser, web: WebSess) -> Response:
    """Moderation (the founder or a hub administrator): a new name, checked as at creation; errors inline."""
    team = teams.get(session, slug)
    teams.check_rename(team, user)  # a 403 page before any look at the form
    form = await request.form()
    values = {"name": str(form.get("name", ""))}
    try:
        data = teams.TeamName.model_validate(values)
        teams.rename(session, user, team, data)
    except ValidationError as exc:
        return _team(request, slug, session, user, web, values=values, errors=form_errors(exc), status_code=422)
    except AppError as exc:
        errors = {exc.field or "form": exc.message}
        return _team(request, slug, session, user, web, values=values, errors=errors, status_code=exc.status_code)
    return see_other(teams.team_path(team.name))


# Defined last: the CSRF test posts every form in order, and leaving or removing may end the team the others act on.
@router.post("/teams/{slug}/leave", dependencies=[CSRF])
def leave_team(slug: str, session: DB, user: RequiredPageUser) -> Response:
    teams.leave(session, user, teams.get(session, slug))
    return see_other("/teams")


@router.post("/teams/{slug}/remove", dependencies=[CSRF])
def remove_team(slug: str, session: DB, user: RequiredPageUser) -> Response:
    """Moderation (a hub administrator): the team and its memberships go; the members' samples stay theirs."""
    teams.remove_team(session, user, teams.get(session, slug))
    return see_other("/teams")
