"""Teams: found, join and leave (one team at a time), the founder's place passing on and the last member's leaving
ending the team; only the founder and admins manage members; the standings are the ledger's sums of the current
members' verified samples; names follow the username rules, descriptions are shown as text; a few teams per
account a day; the open statistics export of every team; hub administrators rename and remove teams (founders
rename theirs); the standings page by cursor."""

from __future__ import annotations

import csv
import html
import io
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from starlette.testclient import TestClient

from swarmhub.server.app import create_app
from swarmhub.server.models import Experiment, Team, TeamMember, User, VolunteerTotal, utcnow

from .conftest import api_token, login, make_experiment, make_user
from .support import observe, witness

pytestmark = pytest.mark.both_databases  # case-insensitive names and grouped sums on each database

PAYLOAD = "<img src=x onerror=alert(1)>"


def members(db: Any, name: str) -> dict[str, str]:
    """username -> role, as the table holds it."""
    with db() as session:
        rows = session.execute(
            select(User.username, TeamMember.role)
            .join(TeamMember, TeamMember.user_id == User.id)
            .join(Team, Team.id == TeamMember.team_id)
            .where(Team.name == name)
        ).all()
        return dict(rows)


def founder(db: Any, name: str) -> str | None:
    with db() as session:
        return session.scalar(select(User.username).join(Team, Team.founder_id == User.id).where(Team.name == name))


def test_found_join_leave_and_the_founders_place_passes_on(client, db):
    for name in ("ada", "grace", "linus", "olga"):
        make_user(db, name)
    ada, grace, linus, olga = (api_token(client, n) for n in ("ada", "grace", "linus", "olga"))

    created = client.post("/api/teams", json={"name": "Rustaceans", "description": "We crab"}, headers=ada)
    assert created.status_code == 201, created.text
    assert created.json()["founder"] == "ada" and created.json()["members"] == 1
    assert members(db, "Rustaceans") == {"ada": "admin"}
    for who in (grace, linus, olga):
        assert client.post("/api/teams/rustaceans/join", headers=who).json() == {"team": "Rustaceans", "role": "member"}
    assert client.post("/api/teams/Rustaceans/admins", json={"username": "linus"}, headers=ada).status_code == 204

    # One team at a time: neither founding nor joining another while in one.
    other = client.post("/api/teams", json={"name": "Gophers"}, headers=grace)
    assert other.status_code == 409 and other.json()["field"] == "name"
    client.post("/api/teams", json={"name": "Gophers"}, headers=make_token(client, db, "ken"))
    joined = client.post("/api/teams/Gophers/join", headers=grace)
    assert joined.status_code == 409 and joined.json()["field"] == "team"
    assert client.get("/api/users/grace").json()["team"] == "Rustaceans"

    # The founder leaves: the oldest admin (linus), not the older plain member (grace), takes over.
    assert client.post("/api/teams/Rustaceans/leave", headers=ada).json() == {"team": None, "role": None}
    assert founder(db, "Rustaceans") == "linus"
    assert client.get("/api/users/ada").json()["team"] is None
    assert client.post("/api/teams/Rustaceans/leave", headers=ada).status_code == 409  # not in it any more
    # Without an admin left, the oldest member becomes founder and admin.
    client.post("/api/teams/Rustaceans/leave", headers=linus)
    assert founder(db, "Rustaceans") == "grace" and members(db, "Rustaceans") == {"grace": "admin", "olga": "member"}
    client.post("/api/teams/Rustaceans/leave", headers=grace)
    client.post("/api/teams/Rustaceans/leave", headers=olga)
    # The last one out ends the team; its name is free again.
    assert client.get("/api/teams/Rustaceans").status_code == 404
    assert client.post("/api/teams", json={"name": "rustaceans"}, headers=olga).status_code == 201


def make_token(client: TestClient, db: Any, name: str) -> dict[str, str]:
    make_user(db, name)
    return api_token(client, name)


def test_names_follow_the_username_rules_and_are_unique_whatever_the_case(client, db):
    ada, grace = make_token(client, db, "ada"), make_token(client, db, "grace")
    for bad in (PAYLOAD, "a", "x" * 33, "-dash", "two words", "swarm_hub"):
        response = client.post("/api/teams", json={"name": bad}, headers=ada)
        assert response.status_code in (409, 422), (bad, response.text)
        body = response.json()
        assert body.get("field") == "name" or body["detail"][0]["loc"] == ["body", "name"], (bad, body)
    too_long = client.post("/api/teams", json={"name": "ok", "description": "d" * 501}, headers=ada)
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["body", "description"]
    assert client.post("/api/teams", json={"name": "Crabs"}, headers=ada).status_code == 201
    taken = client.post("/api/teams", json={"name": "CRABS"}, headers=grace)
    assert taken.status_code == 409 and taken.json() == {"detail": "that team name is taken", "field": "name"}
    with db() as session:
        assert session.scalar(select(func.count(Team.id))) == 1


def page_post(browser: TestClient, csrf: str, path: str, **form: str) -> Any:
    return browser.post(path, data={**form, "csrf_token": csrf}, follow_redirects=False)


def test_only_the_founder_and_admins_manage_members(app, client, db):
    for name in ("ada", "linus", "grace", "olga", "ken", "rob"):
        make_user(db, name)
    tokens = {n: api_token(client, n) for n in ("ada", "linus", "grace", "olga", "ken", "rob")}
    client.post("/api/teams", json={"name": "Crabs"}, headers=tokens["ada"])
    client.post("/api/teams", json={"name": "Gophers"}, headers=tokens["ken"])
    for name in ("linus", "grace", "olga"):
        client.post("/api/teams/Crabs/join", headers=tokens[name])
    client.post("/api/teams/Gophers/join", headers=tokens["rob"])
    client.post("/api/teams/Crabs/admins", json={"username": "linus"}, headers=tokens["ada"])

    browsers = {}
    for name in ("ada", "linus", "grace", "ken"):
        browsers[name] = TestClient(app)
        browsers[name].csrf = login(browsers[name], name)  # type: ignore[attr-defined]

    def post(who: str, path: str) -> Any:
        return page_post(browsers[who], browsers[who].csrf, path)  # type: ignore[attr-defined]

    # A plain member may neither remove nor promote anyone.
    assert post("grace", "/teams/Crabs/members/olga/remove").status_code == 403
    assert post("grace", "/teams/Crabs/members/olga/promote").status_code == 403
    assert client.delete("/api/teams/Crabs/members/olga", headers=tokens["grace"]).status_code == 403
    # Another team's founder cannot act here, and no one acts here on another team's member.
    assert post("ken", "/teams/Crabs/members/olga/remove").status_code == 403
    assert post("ada", "/teams/Crabs/members/rob/remove").status_code == 404
    assert client.delete("/api/teams/Crabs/members/rob", headers=tokens["ada"]).json()["field"] == "username"
    # An admin removes no founder and no other admin.
    assert post("linus", "/teams/Crabs/members/ada/remove").status_code == 403
    assert members(db, "Crabs") == {"ada": "admin", "linus": "admin", "grace": "member", "olga": "member"}
    assert members(db, "Gophers") == {"ken": "admin", "rob": "member"}

    # An admin removes a plain member; the founder removes an admin.
    assert post("linus", "/teams/Crabs/members/olga/remove").status_code == 303
    assert post("ada", "/teams/Crabs/members/grace/promote").status_code == 303
    assert post("linus", "/teams/Crabs/members/grace/remove").status_code == 403
    assert post("ada", "/teams/Crabs/members/grace/remove").status_code == 303
    assert members(db, "Crabs") == {"ada": "admin", "linus": "admin"}
    # The controls are shown to those who may use them only.
    assert "/members/linus/remove" in browsers["ada"].get("/teams/Crabs").text
    assert "/remove" not in browsers["ken"].get("/teams/Crabs").text


def test_standings_are_the_ledgers_sums_of_current_members(client, db):
    olga = make_user(db, "olga")
    for name in ("ada", "grace", "linus", "ken"):
        make_user(db, name)
    tokens = {n: api_token(client, n) for n in ("ada", "grace", "linus", "ken")}
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    beta = make_experiment(db, olga, slug="beta", status="running")
    draft = make_experiment(db, olga, slug="secret", status="draft")
    t0 = utcnow() - timedelta(minutes=5)
    for experiment, senders in (
        (alpha, [("ada", "QmA", 100), ("grace", "QmG", 30), ("linus", "QmL", 50), ("ken", "QmK", 7)]),
        (beta, [("ada", "QmA2", 20), ("linus", "QmL2", 90)]),
        (draft, [("ada", "QmA3", 1000)]),
    ):
        observe(db, experiment.id, t0, *[(n, p, 1, s) for n, p, s in senders])
        witness(db, experiment.id, t0 + timedelta(seconds=1), f"r-{experiment.slug}", 1,
                [(n, p, float(s)) for n, p, s in senders])  # fmt: skip
    client.post("/api/teams", json={"name": "Crabs"}, headers=tokens["ada"])
    client.post("/api/teams/Crabs/join", headers=tokens["grace"])
    client.post("/api/teams", json={"name": "Gophers"}, headers=tokens["linus"])
    # ken is in no team: his samples count for none.

    with db() as session:

        def verified(names: list[str], slugs: list[str]) -> int:
            return int(
                session.scalar(
                    select(func.sum(VolunteerTotal.verified_samples))
                    .join(User, User.id == VolunteerTotal.user_id)
                    .join(Experiment, Experiment.id == VolunteerTotal.experiment_id)
                    .where(User.username.in_(names), Experiment.slug.in_(slugs))
                )
                or 0
            )

        crabs_all, gophers_all = verified(["ada", "grace"], ["alpha", "beta"]), verified(["linus"], ["alpha", "beta"])
        crabs_alpha, gophers_alpha = verified(["ada", "grace"], ["alpha"]), verified(["linus"], ["alpha"])
        alpha_total = verified(["ada", "grace", "linus", "ken"], ["alpha"])
    assert crabs_all > 0 and gophers_all > 0 and crabs_all != gophers_all

    hub = client.get("/api/teams").json()
    assert [(t["name"], t["members"], t["verified_samples"]) for t in hub] == sorted(
        [("Crabs", 2, crabs_all), ("Gophers", 1, gophers_all)], key=lambda t: -t[2]
    )  # the draft's 1000 samples count for no one here
    assert [t["rank"] for t in hub] == [1, 2]
    board = client.get("/api/experiments/alpha/teams").json()
    assert {t["name"]: (t["verified_samples"], t["contributors"]) for t in board} == {
        "Crabs": (crabs_alpha, 2),
        "Gophers": (gophers_alpha, 1),
    }
    assert {t["name"]: t["share"] for t in board}["Crabs"] == round(crabs_alpha / alpha_total, 4)
    crabs = client.get("/api/teams/Crabs").json()
    assert {m["username"]: m["verified_samples"] for m in crabs["member_list"]} == {
        "ada": crabs_all - verified_of(client, "grace"),
        "grace": verified_of(client, "grace"),
    }
    assert {e["slug"]: e["verified_samples"] for e in crabs["experiments"]} == {
        "alpha": crabs_alpha,
        "beta": crabs_all - crabs_alpha,
    }
    # The dashboard shows the same table.
    page = client.get("/experiments/alpha").text
    assert 'data-team="Crabs"' in page and f"{crabs_alpha:,}" in page

    # A member's whole contribution moves with them: grace leaves, and Crabs loses all of hers.
    client.post("/api/teams/Crabs/leave", headers=tokens["grace"])
    assert client.get("/api/teams/Crabs").json()["verified_samples"] == crabs_all - verified_of(client, "grace")


def verified_of(client: TestClient, username: str) -> int:
    return int(client.get(f"/api/users/{username}").json()["verified_samples"])


def test_team_pages_show_markup_as_text_and_hide_hidden_members(app, client, db):
    make_user(db, "ada")
    make_user(db, "shy")
    client.post("/api/teams", json={"name": "Crabs", "description": PAYLOAD}, headers=api_token(client, "ada"))
    client.post("/api/teams/Crabs/join", headers=api_token(client, "shy"))
    with db.begin() as session:
        session.scalar(select(User).where(User.username == "shy")).profile_hidden = True
    page = client.get("/teams/crabs")
    assert page.status_code == 200
    assert PAYLOAD not in page.text and html.escape(PAYLOAD, quote=False) in page.text
    assert "/u/shy" not in page.text and 'id="hidden-members"' in page.text
    detail = client.get("/api/teams/Crabs").json()
    assert detail["members"] == 2 and detail["hidden_members"] == 1
    assert [m["username"] for m in detail["member_list"]] == ["ada"]
    assert 'href="/teams/Crabs"' in client.get("/u/ada").text
    # A founder who hides their profile is not named either.
    assert detail["founder"] == "ada" and "led by ada" in page.text
    with db.begin() as session:
        session.scalar(select(User).where(User.username == "ada")).profile_hidden = True
    assert client.get("/api/teams/Crabs").json()["founder"] is None
    assert client.get("/api/teams").json()[0]["founder"] is None
    assert "led by" not in client.get("/teams/Crabs").text and "/u/ada" not in client.get("/teams/Crabs").text
    assert client.get("/teams/nobody").status_code == 404


def test_the_create_form_founds_a_team_and_shows_errors_inline(app, client, db):
    make_user(db, "ada")
    csrf = login(client, "ada")
    refused = page_post(client, csrf, "/teams", name=PAYLOAD, description="")
    assert refused.status_code == 422 and 'id="error-name"' in refused.text
    assert PAYLOAD not in refused.text  # the value echoed back is escaped
    created = page_post(client, csrf, "/teams", name="Crabs", description="We crab")
    assert created.status_code == 303 and created.headers["location"] == "/teams/Crabs"
    assert members(db, "Crabs") == {"ada": "admin"}
    assert page_post(client, csrf, "/teams/Crabs/leave").status_code == 303
    assert client.get("/api/teams").json() == []


def test_an_account_founds_a_few_teams_a_day(app, client, db, settings):
    make_user(db, "root")  # the first account is the administrator, whom quotas spare
    ada = make_token(client, db, "ada")
    helpers = [make_token(client, db, f"helper{i}") for i in range(3)]
    for i in range(settings.quota_teams_per_day):  # founded, handed to a helper, left: the team stays
        assert client.post("/api/teams", json={"name": f"flood{i}"}, headers=ada).status_code == 201
        client.post(f"/api/teams/flood{i}/join", headers=helpers[i])
        client.post(f"/api/teams/flood{i}/leave", headers=ada)
    refused = client.post("/api/teams", json={"name": "flood9"}, headers=ada)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
    assert refused.json()["field"] == "name"
    with db() as session:
        assert session.scalar(select(func.count(Team.id))) == settings.quota_teams_per_day


def test_a_team_founded_and_deleted_still_counts_toward_the_founders_quota(app, client, db, settings):
    """Founding a team, leaving it (the last member: it is deleted) and founding again would be no quota at all;
    nor does an administrator's removal of a team give its founder another."""
    root = make_token(client, db, "root")  # the first account is the administrator, whom quotas spare
    ada = make_token(client, db, "ada")
    for i in range(settings.quota_teams_per_day):
        assert client.post("/api/teams", json={"name": f"churn{i}"}, headers=ada).status_code == 201
        if i == 0:  # removed by the administrator
            assert client.delete(f"/api/teams/churn{i}", headers=root).status_code == 204
        else:  # left by its only member: deleted with her
            assert client.post(f"/api/teams/churn{i}/leave", headers=ada).status_code in (200, 204)
    assert client.get("/api/teams").json() == []
    refused = client.post("/api/teams", json={"name": "churn9"}, headers=ada)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0, refused.text
    assert refused.json()["field"] == "name"
    with db() as session:
        assert session.scalar(select(func.count(Team.id))) == 0


def test_the_database_keeps_names_unique_whatever_the_case_and_one_team_per_volunteer(client, db):
    """What two requests at once could both get past the service's checks with: the unique index on lower(name)
    and the membership's primary key refuse the second write (``teams.create`` and ``teams.join`` answer it 409)."""
    make_user(db, "ada")
    grace = make_user(db, "grace")
    client.post("/api/teams", json={"name": "Crabs"}, headers=api_token(client, "ada"))
    client.post("/api/teams", json={"name": "Gophers"}, headers=api_token(client, "grace"))
    with pytest.raises(IntegrityError), db.begin() as session:
        session.add(Team(name="CRABS", description=""))
    with pytest.raises(IntegrityError), db.begin() as session:
        crabs = session.scalar(select(Team).where(Team.name == "Crabs"))
        session.add(TeamMember(user_id=grace.id, team_id=crabs.id, role="member"))
    assert members(db, "Crabs") == {"ada": "admin"} and members(db, "Gophers") == {"grace": "admin"}


# ---- the open statistics export


def test_stats_export_counts_as_the_standings_and_names_no_hidden_member(client, db):
    olga = make_user(db, "olga")
    for name in ("ada", "shy", "linus"):
        make_user(db, name)
    tokens = {n: api_token(client, n) for n in ("ada", "shy", "linus")}
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    draft = make_experiment(db, olga, slug="secret", status="draft")
    t0 = utcnow() - timedelta(minutes=5)
    for experiment, senders in (
        (alpha, [("ada", "QmA", 100), ("shy", "QmS", 30), ("linus", "QmL", 50)]),
        (draft, [("ada", "QmA3", 1000)]),
    ):
        observe(db, experiment.id, t0, *[(n, p, 1, s) for n, p, s in senders])
        witness(db, experiment.id, t0 + timedelta(seconds=1), f"r-{experiment.slug}", 1,
                [(n, p, float(s)) for n, p, s in senders])  # fmt: skip
    client.post("/api/teams", json={"name": "Crabs"}, headers=tokens["ada"])
    client.post("/api/teams/Crabs/join", headers=tokens["shy"])
    client.post("/api/teams", json={"name": "Gophers"}, headers=tokens["linus"])
    with db.begin() as session:
        session.scalar(select(User).where(User.username == "shy")).profile_hidden = True
        # A name the create route refuses, stored by an older rule or an operator: a spreadsheet must not run it.
        session.add(Team(name="=1+2", description=""))

    response = client.get("/api/stats/teams.json")
    assert response.status_code == 200, response.text
    assert response.headers["cache-control"] == "public, max-age=300"
    rows = response.json()["teams"]
    standings = client.get("/api/teams").json()
    assert [(r["rank"], r["name"], r["members"], r["verified_samples"]) for r in rows] == [
        (t["rank"], t["name"], t["members"], t["verified_samples"]) for t in standings
    ]
    crabs = next(r for r in rows if r["name"] == "Crabs")
    detail = client.get("/api/teams/Crabs").json()
    assert crabs["member_names"] == ["ada"] and crabs["hidden_members"] == 1 and crabs["members"] == 2
    assert "shy" not in response.text  # counted, never named
    assert crabs["experiments"] == [
        {"slug": e["slug"], "verified_samples": e["verified_samples"], "share": e["share"], "rank": e["rank"]}
        for e in detail["experiments"]
    ]
    assert [e["slug"] for e in crabs["experiments"]] == ["alpha"]  # the draft counts for no one
    assert crabs["experiments"][0]["share"] == next(
        t["share"] for t in client.get("/api/experiments/alpha/teams").json() if t["name"] == "Crabs"
    )

    text = client.get("/api/stats/teams.csv")
    assert text.headers["content-type"].startswith("text/csv")
    parsed = list(csv.DictReader(io.StringIO(text.text)))
    assert parsed[0].keys() == {"team", "experiment", "rank", "members", "verified_samples", "share"}
    expected = []
    for r in rows:
        name = "'" + r["name"] if r["name"].startswith("=") else r["name"]
        expected.append([name, "", str(r["rank"]), str(r["members"]), str(r["verified_samples"]), ""])
        for e in r["experiments"]:
            figures = [e["rank"], r["members"], e["verified_samples"], e["share"]]
            expected.append([name, e["slug"], *map(str, figures)])
    assert [list(row.values()) for row in parsed] == expected
    assert "'=1+2" in text.text and "shy" not in text.text


def test_stats_export_has_an_etag_per_coding_and_is_kept_per_process(app, client, db, settings):
    make_user(db, "ada")
    client.post("/api/teams", json={"name": "Crabs"}, headers=api_token(client, "ada"))
    for path in ("/api/stats/teams.json", "/api/stats/teams.csv"):
        plain = client.get(path, headers={"Accept-Encoding": "identity"})
        packed = client.get(path, headers={"Accept-Encoding": "gzip"})
        assert "content-encoding" not in plain.headers and packed.headers["content-encoding"] == "gzip"
        assert packed.content == plain.content and packed.headers["etag"] != plain.headers["etag"]
        assert packed.headers["vary"] == "Accept-Encoding"
        again = client.get(path, headers={"Accept-Encoding": "identity", "If-None-Match": plain.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
        other = client.get(path, headers={"Accept-Encoding": "gzip", "If-None-Match": plain.headers["etag"]})
        assert other.status_code == 200  # the plain body's tag is not the gzipped one's

    before = client.get("/api/stats/teams.json").json()["teams"]
    client.post("/api/teams/Crabs/leave", headers=api_token(client, "ada"))  # the last one out ends the team
    assert client.get("/api/stats/teams.json").json()["teams"] == before  # this process keeps its copy
    with TestClient(create_app(settings.model_copy(update={"stats_cache_seconds": 0}))) as fresh:
        assert fresh.get("/api/stats/teams.json").json()["teams"] == []


# ---- moderation: hub administrators rename and remove teams; founders rename theirs


@pytest.fixture
def crew(client, db):
    """root (the hub's administrator), fred founding "crew" with tara (admin) and mel, otis founding "rivals"."""
    for name in ("root", "fred", "tara", "mel", "otis"):
        make_user(db, name)
    tokens = {n: api_token(client, n) for n in ("root", "fred", "tara", "mel", "otis")}
    client.post("/api/teams", json={"name": "crew"}, headers=tokens["fred"])
    client.post("/api/teams", json={"name": "rivals"}, headers=tokens["otis"])
    for name in ("tara", "mel"):
        client.post("/api/teams/crew/join", headers=tokens[name])
    client.post("/api/teams/crew/admins", json={"username": "tara"}, headers=tokens["fred"])
    return tokens


def test_the_founder_and_administrators_rename_a_team_with_the_rules_of_a_new_name(client, db, crew):
    def rename(who: str, name: str, team: str = "crew") -> Any:
        return client.post(f"/api/teams/{team}/rename", json={"name": name}, headers=crew[who])

    assert client.post("/api/teams/crew/rename", json={"name": "x1"}).status_code == 401
    for who in ("mel", "tara", "otis"):  # a member, the team's own admin, another team's founder
        assert rename(who, "hijacked").status_code == 403, who
    assert rename("fred", PAYLOAD).status_code == 422
    assert rename("fred", "a").json()["detail"][0]["loc"] == ["body", "name"]
    taken = rename("fred", "RIVALS")
    assert taken.status_code == 409 and taken.json()["field"] == "name"
    assert rename("fred", "Swarm_Hub").status_code == 409  # reserved, as at creation
    assert founder(db, "crew") == "fred" and members(db, "crew") == {"fred": "admin", "tara": "admin", "mel": "member"}

    renamed = rename("fred", "Crew")  # a change of case alone
    assert renamed.status_code == 200 and renamed.json()["name"] == "Crew" and renamed.json()["url"] == "/teams/Crew"
    moved = rename("root", "ship", team="Crew")
    assert moved.status_code == 200 and moved.json()["members"] == 3
    assert client.get("/api/teams/crew").status_code == 404
    assert members(db, "ship") == {"fred": "admin", "tara": "admin", "mel": "member"} and founder(db, "ship") == "fred"


def test_only_administrators_remove_a_team_and_the_members_keep_their_samples(client, db, crew):
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    t0 = utcnow() - timedelta(minutes=5)
    observe(db, alpha.id, t0, ("fred", "QmF", 1, 40), ("mel", "QmM", 1, 20))
    witness(db, alpha.id, t0 + timedelta(seconds=1), "r-1", 1, [("fred", "QmF", 40.0), ("mel", "QmM", 20.0)])
    before = {n: verified_of(client, n) for n in ("fred", "mel")}
    assert all(before.values())

    assert client.delete("/api/teams/crew").status_code == 401
    for who in ("mel", "tara", "fred", "otis"):  # the founder too: a team ends when its last member leaves
        assert client.delete("/api/teams/crew", headers=crew[who]).status_code == 403, who
    assert members(db, "crew") == {"fred": "admin", "tara": "admin", "mel": "member"}
    assert client.delete("/api/teams/crew", headers=crew["root"]).status_code == 204
    assert client.get("/api/teams/crew").status_code == 404
    with db() as session:
        assert session.scalar(select(func.count()).select_from(TeamMember)) == 1  # otis, in rivals
    assert {n: verified_of(client, n) for n in ("fred", "mel")} == before
    assert [t["name"] for t in client.get("/api/teams").json()] == ["rivals"]
    assert client.get("/api/users/fred").json()["team"] is None
    # Free again: fred founds a team, mel joins another.
    assert client.post("/api/teams", json={"name": "crew2"}, headers=crew["fred"]).status_code == 201
    assert client.post("/api/teams/rivals/join", headers=crew["mel"]).status_code == 200
    assert client.delete("/api/teams/nobody", headers=crew["root"]).status_code == 404


def test_the_team_page_shows_moderation_controls_to_whom_they_serve(app, db, crew):
    def page_for(who: str | None) -> tuple[TestClient, str, str]:
        browser = TestClient(app)
        csrf = login(browser, who) if who else ""
        return browser, csrf, browser.get("/teams/crew").text

    for who, rename, remove in (
        (None, False, False),
        ("mel", False, False),
        ("tara", False, False),
        ("otis", False, False),
        ("fred", True, False),
        ("root", True, True),
    ):
        _, _, text = page_for(who)
        assert ('id="rename-team"' in text, 'id="remove-team"' in text) == (rename, remove), who

    browser, csrf, _ = page_for("fred")
    taken = page_post(browser, csrf, "/teams/crew/rename", name="rivals")
    assert taken.status_code == 409 and 'id="error-name"' in taken.text
    bad = page_post(browser, csrf, "/teams/crew/rename", name=PAYLOAD)
    assert bad.status_code == 422 and PAYLOAD not in bad.text
    moved = page_post(browser, csrf, "/teams/crew/rename", name="ship")
    assert moved.status_code == 303 and moved.headers["location"] == "/teams/ship"
    assert page_post(browser, csrf, "/teams/ship/remove").status_code == 403

    browser, csrf, _ = page_for("root")
    gone = page_post(browser, csrf, "/teams/ship/remove")
    assert gone.status_code == 303 and gone.headers["location"] == "/teams"
    assert browser.get("/teams/ship").status_code == 404


# ---- paging


def one_member_team(session: Any, experiment_id: int, name: str, username: str, verified: int) -> None:
    """A team ``name`` founded by ``username``, its one member (an admin), with ``verified`` samples in the
    experiment, written straight to the tables."""
    user = User(username=username, password_hash="x")
    session.add(user)
    session.flush()
    team = Team(name=name, description="", founder_id=user.id, creator_id=user.id)
    session.add(team)
    session.flush()
    session.add(TeamMember(user_id=user.id, team_id=team.id, role="admin"))
    session.add(VolunteerTotal(experiment_id=experiment_id, user_id=user.id, sort_name=username,
                               verified_samples=verified))  # fmt: skip


def test_standings_page_by_cursor_both_ways_with_absolute_ranks(client, db):
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    # (team, verified of its one member): ties on verified, and names that differ from their order only in case
    figures = [("zed", 50), ("Amy", 50), ("bob", 50), ("cat", 70), ("dan", 0), ("Eve", 0), ("fay", 20), ("gus", 0)]
    with db.begin() as session:
        for name, verified in figures:
            one_member_team(session, alpha.id, name, f"m-{name}", verified)
    whole = client.get("/api/teams", params={"limit": 500})
    assert "next-cursor" not in whole.headers and "link" not in whole.headers
    order = [t["name"] for t in whole.json()]
    assert [t["rank"] for t in whole.json()] == list(range(1, 9))
    assert order[:4] == ["cat", "Amy", "bob", "zed"] and order[4] == "fay" and set(order[5:]) == {"dan", "Eve", "gus"}

    pages, response = [], client.get("/api/teams", params={"limit": 3})
    while True:
        assert response.status_code == 200, response.text
        pages.append(response.json())
        if "next-cursor" not in response.headers:
            break
        assert 'rel="next"' in response.headers["link"]
        response = client.get("/api/teams", params={"limit": 3, "cursor": response.headers["next-cursor"]})
    assert [len(p) for p in pages] == [3, 3, 2]
    assert [t["name"] for p in pages for t in p] == order and [t["rank"] for p in pages for t in p] == list(range(1, 9))
    assert "prev-cursor" in response.headers and 'rel="prev"' in response.headers["link"]
    back = []
    while "prev-cursor" in response.headers:
        response = client.get("/api/teams", params={"limit": 3, "before": response.headers["prev-cursor"]})
        back.insert(0, response.json())
    assert back == pages[:-1]

    for bad in (0, 501):
        refused = client.get("/api/teams", params={"limit": bad})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "limit"]
    assert client.get("/api/teams", params={"cursor": "nonsense"}).json()["field"] == "cursor"
    both = client.get("/api/teams", params={"cursor": "x", "before": "y"})
    assert both.status_code == 400 and both.json()["field"] == "before"

    first = client.get("/teams", params={"limit": 3})
    assert first.status_code == 200 and 'id="next"' in first.text and 'id="prev"' not in first.text
    assert first.text.count("<tr data-team=") == 3
    second = client.get(html.unescape(first.text.split('id="next" href="')[1].split('"')[0]))
    assert 'id="prev"' in second.text and 'id="next"' in second.text
    assert f'data-team="{order[3]}"' in second.text and f'data-team="{order[0]}"' not in second.text
    again = client.get(html.unescape(second.text.split('id="prev" href="')[1].split('"')[0]))
    assert [f'data-team="{n}"' in again.text for n in order[:4]] == [True, True, True, False]
    assert client.get("/teams", params={"limit": 0}).status_code == 422


def test_a_teams_members_come_in_pages_and_its_rank_is_the_standings(client, db):
    """A team of any size: its page lists its named members by cursor (most verified first, ties by who joined
    first), counts the hidden ones without naming them, and gives the rank the standings give."""
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    start = utcnow() - timedelta(days=1)
    # (member, verified, hidden): ties on verified, two hidden profiles among them
    crew = [("m1", 40, False), ("m2", 90, False), ("m3", 40, False), ("m4", 0, False), ("m5", 90, True),
            ("m6", 10, False), ("m7", 40, False), ("m8", 0, True), ("m9", 70, False)]  # fmt: skip
    with db.begin() as session:
        users = []
        for index, (name, verified, hidden) in enumerate(crew):
            user = User(username=name, password_hash="x", profile_hidden=hidden)
            session.add(user)
            session.flush()
            users.append(user)
            session.add(VolunteerTotal(experiment_id=alpha.id, user_id=user.id, sort_name=name,
                                       verified_samples=verified))  # fmt: skip
        big = Team(name="Big", description="", founder_id=users[0].id, creator_id=users[0].id)
        session.add(big)
        session.flush()
        for index, user in enumerate(users):
            session.add(TeamMember(user_id=user.id, team_id=big.id, role="member",
                                   joined_at=start + timedelta(minutes=index)))  # fmt: skip
        for name, verified in (("ahead", 500), ("tied", 380), ("after", 1)):
            one_member_team(session, alpha.id, name, f"lead-{name}", verified)

    named = ["m2", "m9", "m1", "m3", "m7", "m6", "m4"]  # by verified, then joined
    whole = client.get("/api/teams/big", params={"members_limit": 500}).json()
    assert [m["username"] for m in whole["member_list"]] == named and whole["members_next_cursor"] is None
    assert whole["hidden_members"] == 2 and whole["members"] == 9 and whole["verified_samples"] == 380
    standings = {t["name"]: t["rank"] for t in client.get("/api/teams").json()}
    assert standings == {"ahead": 1, "Big": 2, "tied": 3, "after": 4}
    for name, rank in standings.items():
        assert client.get(f"/api/teams/{name}").json()["rank"] == rank

    pages, cursor = [], None
    while True:
        params: dict[str, Any] = {"members_limit": 3} | ({"members_cursor": cursor} if cursor else {})
        page = client.get("/api/teams/big", params=params)
        assert page.status_code == 200, page.text
        pages.append([m["username"] for m in page.json()["member_list"]])
        cursor = page.json()["members_next_cursor"]
        if cursor is None:
            break
    assert pages == [named[0:3], named[3:6], named[6:]]

    bad = client.get("/api/teams/big", params={"members_cursor": "nonsense"})
    assert bad.status_code == 400 and bad.json()["field"] == "members_cursor"
    for limit in (0, 501):
        refused = client.get("/api/teams/big", params={"members_limit": limit})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "members_limit"]

    first = client.get("/teams/big", params={"members_limit": 3})
    assert first.status_code == 200 and first.text.count("<tr data-username=") == 3
    more = html.unescape(first.text.split('id="more-members" href="')[1].split('"')[0])
    second = client.get(more)
    assert [f'data-username="{n}"' in second.text for n in named] == [False] * 3 + [True] * 3 + [False]
    assert "m5" not in second.text and "m8" not in second.text
    assert client.get("/teams/big", params={"members_cursor": "nonsense"}).status_code == 400
