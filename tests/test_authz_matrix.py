"""Who may change what, and read what only organizers may: every state-changing route (and the organizer's swarm
view, and the signed-in caller's own list of joinable experiments) against every role (anonymous, volunteer,
organizer of another experiment, the experiment's organizer, an administrator). Only the right ones succeed; the others
get 401 (anonymous, API) or a redirect to the log-in page (anonymous, pages), 403 otherwise, and change nothing."""

from __future__ import annotations

from typing import Any

import pytest
from hivemind.utils.crypto import RSAPrivateKey
from sqlalchemy import delete, select
from starlette.testclient import TestClient

from swarmhub.server import experiments
from swarmhub.server.models import Experiment, ExperimentBan, SwarmPeerKey, Team, TeamMember, User

from .conftest import PASSWORD, api_token, csrf_from, make_experiment, make_user

ROLES = ["anonymous", "volunteer", "other-organizer", "organizer", "admin"]
MANAGERS = {"organizer", "admin"}
SIGNED_IN = set(ROLES) - {"anonymous"}
PEER_KEY = RSAPrivateKey().get_public_key().to_bytes().decode()
USERS = {"admin": "root", "organizer": "olga", "other-organizer": "otto", "volunteer": "vera"}

# (name, method, path, body, who may)
API_ROUTES: list[tuple[str, str, str, dict[str, Any] | None, set[str]]] = [
    ("create", "POST", "/api/experiments", {"slug": "new-one", "title": "New", "task": "digits"}, SIGNED_IN),
    ("edit", "PATCH", "/api/experiments/target", {"title": "Taken over"}, MANAGERS),
    ("pause", "POST", "/api/experiments/target/status", {"action": "pause"}, MANAGERS),
    ("ban", "POST", "/api/experiments/target/bans", {"username": "vera"}, MANAGERS),
    ("unban", "DELETE", "/api/experiments/target/bans/vera", None, MANAGERS),
    ("swarm-view", "GET", "/api/experiments/target/swarm", None, MANAGERS),  # a read, but it names every peer
    ("swarm-token", "POST", "/api/experiments/target/swarm-token", {"peer_public_key": PEER_KEY}, SIGNED_IN),
    ("probe-upload", "POST", "/api/probe/upload", None, SIGNED_IN),
    ("revoke-own-token", "DELETE", "/api/auth/token", None, SIGNED_IN),
    ("joinable", "GET", "/api/me/joinable", None, SIGNED_IN),  # a read, but it depends on who asks
]
PAGE_ROUTES: list[tuple[str, str, dict[str, str], set[str]]] = [
    ("edit", "/experiments/target/edit", {"title": "Taken over", "task": "digits"}, MANAGERS),
    ("pause", "/experiments/target/status", {"action": "pause"}, MANAGERS),
    ("ban", "/experiments/target/bans", {"username": "vera", "action": "ban"}, MANAGERS),
    ("new-token", "/account/tokens", {"name": "mine"}, SIGNED_IN),
    ("hide-profile", "/account/profile", {"profile_hidden": "on"}, SIGNED_IN),  # one's own profile only
]


@pytest.fixture
def world(client, db):
    users = {role: make_user(db, name) for role, name in USERS.items()}  # root first: the administrator
    make_experiment(db, users["organizer"], slug="target", status="running")
    make_experiment(db, users["other-organizer"], slug="other-run", status="running")
    return users


def reset(db) -> None:
    """The target as each case finds it: running, titled as made, no one removed, no extra experiment, and the
    roles' shared peer key issued to no one yet."""
    with db.begin() as session:
        target = session.query(Experiment).filter_by(slug="target").one()
        target.status, target.title = "running", "Experiment target"
        session.execute(delete(ExperimentBan))
        session.execute(delete(SwarmPeerKey))
        session.query(Experiment).filter_by(slug="new-one").delete()


def changed(db) -> bool:
    with db() as session:
        target = session.query(Experiment).filter_by(slug="target").one()
        extra = session.query(Experiment).filter_by(slug="new-one").count()
        bans = session.query(ExperimentBan).count()
        return target.status != "running" or target.title != "Experiment target" or extra > 0 or bans > 0


@pytest.mark.parametrize("route", API_ROUTES, ids=[r[0] for r in API_ROUTES])
def test_api_route(route, client, db, world):
    name, method, path, body, allowed = route
    for role in ROLES:
        reset(db)
        headers = {} if role == "anonymous" else api_token(client, USERS[role])
        if name == "unban":  # something to undo
            with db.begin() as session:
                target = session.query(Experiment).filter_by(slug="target").one()
                experiments.ban(session, target, "vera")
        kwargs: dict[str, Any] = {"headers": headers}
        if body is not None:
            kwargs["json"] = body
        elif name == "probe-upload":
            kwargs["content"] = b"x" * 1000
        response = client.request(method, path, **kwargs)
        if role in allowed:
            assert response.status_code < 300, (name, role, response.status_code, response.text)
        else:
            assert response.status_code == (401 if role == "anonymous" else 403), (name, role, response.text)
            if name == "unban":
                with db() as session:
                    assert session.query(ExperimentBan).count() == 1, (name, role)
            else:
                assert not changed(db), (name, role)


def browser_for(app, role: str) -> TestClient:
    browser = TestClient(app)
    if role != "anonymous":
        csrf = csrf_from(browser.get("/login").text)
        browser.post("/login", data={"username": USERS[role], "password": PASSWORD, "csrf_token": csrf})
    return browser


@pytest.mark.parametrize("route", PAGE_ROUTES, ids=[r[0] for r in PAGE_ROUTES])
def test_page_form(route, app, client, db, world):
    name, path, form, allowed = route
    with db() as session:  # the form posts the task's parameters as they are (no training change while running)
        target = session.query(Experiment).filter_by(slug="target").one()
        params = {f"param.digits.{key}": str(value) for key, value in target.task_params.items()}
    if name == "edit":
        form = {**form, **params}
    for role in ROLES:
        reset(db)
        with browser_for(app, role) as browser:
            csrf = csrf_from(browser.get("/login" if role == "anonymous" else "/account").text)
            response = browser.post(path, data={**form, "csrf_token": csrf}, follow_redirects=False)
        if role in allowed:
            assert response.status_code in (200, 303), (name, role, response.status_code)
            assert response.headers.get("location", "") != "/login", (name, role)
        elif role == "anonymous":
            assert response.status_code == 303 and response.headers["location"].startswith("/login"), (name, role)
            assert not changed(db)
        else:
            assert response.status_code == 403, (name, role, response.status_code)
            assert not changed(db), (name, role)


# Open figures: every role may read them, and each gets the same body, since caches (Cache-Control: public) may
# hand one answer to anyone. None shows a draft, not even to its organizer or an administrator.
OPEN_ROUTES = [
    "/api/hub",
    "/api/stats/experiments.json",
    "/api/stats/experiments.csv",
    "/api/stats/teams.json",
    "/api/stats/teams.csv",
]


@pytest.mark.parametrize("path", OPEN_ROUTES)
def test_open_figures_are_the_same_for_every_role(path, client, db, world):
    make_experiment(db, world["organizer"], slug="secret-draft", status="draft")
    client.post("/api/teams", json={"name": "vera-crew"}, headers=api_token(client, USERS["volunteer"]))
    bodies = {}
    for role in ROLES:
        headers = {} if role == "anonymous" else api_token(client, USERS[role])
        response = client.get(path, headers=headers)
        assert response.status_code == 200, (path, role, response.text)
        body = response.text if path.endswith(".csv") else response.json()
        if path == "/api/hub":
            body = body["experiments"]  # generated_at moves on between rebuilds
        bodies[role] = body
        assert "secret-draft" not in response.text, (path, role)
        assert ("target" if "teams" not in path else "vera-crew") in response.text, (path, role)
    assert all(body == bodies["anonymous"] for body in bodies.values()), path


# Teams: only the team's founder and admins manage its members; a plain member, another team's founder and the
# hub's administrator are refused (403), a visitor is sent to log in (pages) or gets 401 (API).
TEAM_ROLES = ["anonymous", "admin", "outsider", "member", "team-admin", "founder"]
TEAM_USERS = {"admin": "root", "founder": "fred", "team-admin": "tara", "member": "mel", "outsider": "otis"}
TEAM_MANAGERS = {"team-admin", "founder"}
# (name, method, path, body); every one acts on "mia", a plain member of team "crew"
TEAM_API_ROUTES: list[tuple[str, str, str, dict[str, Any] | None]] = [
    ("remove-member", "DELETE", "/api/teams/crew/members/mia", None),
    ("promote-member", "POST", "/api/teams/crew/admins", {"username": "mia"}),
]
TEAM_PAGE_ROUTES = [
    ("remove-member", "/teams/crew/members/mia/remove"),
    ("promote-member", "/teams/crew/members/mia/promote"),
]


@pytest.fixture
def team_world(client, db):
    users = {role: make_user(db, name) for role, name in TEAM_USERS.items()}  # root first: the administrator
    make_user(db, "mia")
    client.post("/api/teams", json={"name": "crew"}, headers=api_token(client, "fred"))
    client.post("/api/teams", json={"name": "rivals"}, headers=api_token(client, "otis"))
    for name in ("tara", "mel", "mia"):
        client.post("/api/teams/crew/join", headers=api_token(client, name))
    assert (
        client.post("/api/teams/crew/admins", json={"username": "tara"}, headers=api_token(client, "fred")).status_code
        == 204
    )
    return users


def mia_as_made(db) -> bool:
    """Whether mia is still a plain member of crew; puts her back for the next case."""
    with db.begin() as session:
        mia = session.scalar(select(User).where(User.username == "mia"))
        crew = session.scalar(select(Team).where(Team.name == "crew"))
        row = session.get(TeamMember, mia.id)
        unchanged = row is not None and row.team_id == crew.id and row.role == "member"
        if row is None:
            session.add(TeamMember(user_id=mia.id, team_id=crew.id, role="member"))
        else:
            row.role = "member"
        return unchanged


@pytest.mark.parametrize("route", TEAM_API_ROUTES, ids=[r[0] for r in TEAM_API_ROUTES])
def test_team_api_route(route, client, db, team_world):
    name, method, path, body = route
    for role in TEAM_ROLES:
        headers = {} if role == "anonymous" else api_token(client, TEAM_USERS[role])
        response = client.request(method, path, headers=headers, **({"json": body} if body is not None else {}))
        unchanged = mia_as_made(db)
        if role in TEAM_MANAGERS:
            assert response.status_code == 204 and not unchanged, (name, role, response.text)
        else:
            assert response.status_code == (401 if role == "anonymous" else 403), (name, role, response.text)
            assert unchanged, (name, role)


@pytest.mark.parametrize("route", TEAM_PAGE_ROUTES, ids=[r[0] for r in TEAM_PAGE_ROUTES])
def test_team_page_form(route, app, db, team_world):
    name, path = route
    for role in TEAM_ROLES:
        browser = TestClient(app)
        if role == "anonymous":
            csrf = csrf_from(browser.get("/login").text)
        else:
            csrf = csrf_from(browser.get("/login").text)
            browser.post("/login", data={"username": TEAM_USERS[role], "password": PASSWORD, "csrf_token": csrf})
            csrf = csrf_from(browser.get("/account").text)
        with browser:
            response = browser.post(path, data={"csrf_token": csrf}, follow_redirects=False)
        unchanged = mia_as_made(db)
        if role in TEAM_MANAGERS:
            assert response.status_code == 303 and not unchanged, (name, role, response.status_code)
        elif role == "anonymous":
            assert response.status_code == 303 and response.headers["location"].startswith("/login"), (name, role)
            assert unchanged, (name, role)
        else:
            assert response.status_code == 403 and unchanged, (name, role, response.status_code)


# Moderation: a hub administrator renames and removes any team; the founder renames their own; the team's admins,
# its members and anyone else are refused (403), a visitor gets 401 (API) or is sent to log in (pages).
# (name, method, path, body, who may, status when they may)
MODERATION_API_ROUTES: list[tuple[str, str, str, dict[str, Any] | None, set[str], int]] = [
    ("rename-team", "POST", "/api/teams/crew/rename", {"name": "ship"}, {"admin", "founder"}, 200),
    ("remove-team", "DELETE", "/api/teams/crew", None, {"admin"}, 204),
]
MODERATION_PAGE_ROUTES: list[tuple[str, str, dict[str, str], set[str]]] = [
    ("rename-team", "/teams/crew/rename", {"name": "ship"}, {"admin", "founder"}),
    ("remove-team", "/teams/crew/remove", {}, {"admin"}),
]
CREW = {"fred": "admin", "tara": "admin", "mel": "member", "mia": "member"}


def crew_as_made(db) -> bool:
    """Whether team crew is as the fixture made it (name, founder, members and roles); puts it back for the next
    case, under its name, whatever a case did to it (renamed it, removed it)."""
    with db.begin() as session:
        users = {u.username: u for u in session.scalars(select(User).where(User.username.in_(list(CREW))))}
        crew = session.scalar(select(Team).where(Team.name.in_(["crew", "ship"])))
        rows = session.execute(
            select(User.username, TeamMember.role).join(TeamMember, TeamMember.user_id == User.id)
            .where(TeamMember.team_id == (crew.id if crew else -1))
        ).all()  # fmt: skip
        unchanged = crew is not None and crew.name == "crew" and crew.founder_id == users["fred"].id
        unchanged = unchanged and dict(rows) == CREW
        if crew is None:
            crew = Team(name="crew", description="", founder_id=users["fred"].id, creator_id=users["fred"].id)
            session.add(crew)
            session.flush()
            for name, role in CREW.items():
                session.add(TeamMember(user_id=users[name].id, team_id=crew.id, role=role))
        crew.name = "crew"
        return unchanged


@pytest.mark.parametrize("route", MODERATION_API_ROUTES, ids=[r[0] for r in MODERATION_API_ROUTES])
def test_team_moderation_api_route(route, client, db, team_world):
    name, method, path, body, allowed, ok = route
    assert crew_as_made(db)
    for role in TEAM_ROLES:
        headers = {} if role == "anonymous" else api_token(client, TEAM_USERS[role])
        response = client.request(method, path, headers=headers, **({"json": body} if body is not None else {}))
        unchanged = crew_as_made(db)
        if role in allowed:
            assert response.status_code == ok and not unchanged, (name, role, response.text)
        else:
            assert response.status_code == (401 if role == "anonymous" else 403), (name, role, response.text)
            assert unchanged, (name, role)


@pytest.mark.parametrize("route", MODERATION_PAGE_ROUTES, ids=[r[0] for r in MODERATION_PAGE_ROUTES])
def test_team_moderation_page_form(route, app, db, team_world):
    name, path, form, allowed = route
    for role in TEAM_ROLES:
        browser = TestClient(app)
        csrf = csrf_from(browser.get("/login").text)
        if role != "anonymous":
            browser.post("/login", data={"username": TEAM_USERS[role], "password": PASSWORD, "csrf_token": csrf})
            csrf = csrf_from(browser.get("/account").text)
        with browser:
            response = browser.post(path, data={**form, "csrf_token": csrf}, follow_redirects=False)
        unchanged = crew_as_made(db)
        if role in allowed:
            assert response.status_code == 303 and not unchanged, (name, role, response.status_code)
        elif role == "anonymous":
            assert response.status_code == 303 and response.headers["location"].startswith("/login"), (name, role)
            assert unchanged, (name, role)
        else:
            assert response.status_code == 403 and unchanged, (name, role, response.status_code)
