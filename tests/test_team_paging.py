"""A team's members, the experiments a team helped and an experiment's teams come in pages by cursor, as the
leaderboard's: ``limit`` (bounded by default), ``cursor``, the ``Next-Cursor`` and ``Link`` headers, a bare list as
the body. Following them from the first page lists every row once, in order, with the ranks of the whole list; the
team's page and the dashboard show the first page and a link to the next."""

from __future__ import annotations

import html
from datetime import timedelta
from typing import Any

import pytest

from swarmhub.server import teams
from swarmhub.server.models import Experiment, ExperimentTotal, Team, TeamMember, User, VolunteerTotal, utcnow

from .conftest import make_experiment, make_user

pytestmark = pytest.mark.both_databases  # keyset pages over grouped sums and names whatever the case

MORE = 3  # rows beyond the default page


def follow(client: Any, path: str, params: dict[str, Any] | None = None) -> list[list[Any]]:
    """Every page from ``path`` on, following the ``Link`` header (and checking ``Next-Cursor`` beside it)."""
    pages = []
    response = client.get(path, params=params)
    while True:
        assert response.status_code == 200, response.text
        pages.append(response.json())
        if "Link" not in response.headers:
            assert "Next-Cursor" not in response.headers
            return pages
        link = response.headers["Link"]
        assert link.endswith('>; rel="next"') and response.headers["Next-Cursor"] in html.unescape(link)
        response = client.get(link[1 : -len('>; rel="next"')])


def refuses_bad_paging(client: Any, path: str, limit_max: int) -> None:
    bad = client.get(path, params={"cursor": "nonsense"})
    assert bad.status_code == 400 and bad.json()["field"] == "cursor", bad.text
    for limit in (0, limit_max + 1):
        refused = client.get(path, params={"limit": limit})
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "limit"]


def user(session: Any, name: str, hidden: bool = False) -> User:
    row = User(username=name, password_hash="x", profile_hidden=hidden)
    session.add(row)
    session.flush()
    return row


def team_of(session: Any, name: str, members: list[User], start: Any = None) -> Team:
    team = Team(name=name, description="", founder_id=members[0].id, creator_id=members[0].id)
    session.add(team)
    session.flush()
    start = start or utcnow() - timedelta(days=1)
    for index, member in enumerate(members):
        session.add(TeamMember(user_id=member.id, team_id=team.id, joined_at=start + timedelta(minutes=index)))
    return team


def verified(session: Any, experiment_id: int, member: User, samples: int) -> None:
    row = VolunteerTotal(experiment_id=experiment_id, user_id=member.id, sort_name=member.username)
    row.verified_samples = samples
    session.add(row)


def experiments_like(db: Any, owner: User, slugs: list[str], status: str = "running") -> dict[str, int]:
    """Experiments ``slugs`` (their IDs), copies of one made the usual way: a signing key each would be slow."""
    first = make_experiment(db, owner, slug=slugs[0], status=status)
    ids = {slugs[0]: first.id}
    with db.begin() as session:
        template = session.get(Experiment, first.id)
        columns = {c.key: getattr(template, c.key) for c in Experiment.__mapper__.column_attrs if c.key != "id"}
        for slug in slugs[1:]:
            copy = Experiment(**{**columns, "slug": slug, "title": f"Experiment {slug}", "status": status})
            session.add(copy)
            session.flush()
            ids[slug] = copy.id
    return ids


def test_a_teams_members_come_in_pages_as_the_leaderboards(client, db):
    """GET /api/teams/NAME/members: 100 a page unless asked, most verified first (ties: who joined first); a
    member who hid their profile is never named. The team's own members_next_cursor continues there too."""
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    count = teams.MEMBERS_LIMIT + MORE
    with db.begin() as session:
        crew = [user(session, f"m{i:03d}", hidden=i == 7) for i in range(count)]
        for i, member in enumerate(crew):
            verified(session, alpha.id, member, (i * 37) % 10 * 10)  # ten values, many ties
        team_of(session, "Big", crew)
    # by verified, then by joining time (here: the index)
    order = sorted(range(count), key=lambda i: (-((i * 37) % 10 * 10), i))
    named = [f"m{i:03d}" for i in order if i != 7]

    pages = follow(client, "/api/teams/big/members")
    assert [len(page) for page in pages] == [teams.MEMBERS_LIMIT, MORE - 1]  # bounded by default
    assert [m["username"] for page in pages for m in page] == named
    assert pages[0][0] == {
        "username": named[0],
        "role": "member",
        "founder": named[0] == "m000",
        "joined_at": pages[0][0]["joined_at"],
        "verified_samples": 90,
        "profile_url": f"/u/{named[0]}",
    }
    small = follow(client, "/api/teams/Big/members", {"limit": 40})
    assert [len(page) for page in small] == [40, 40, count - 1 - 80]
    assert [m["username"] for page in small for m in page] == named

    detail = client.get("/api/teams/Big", params={"members_limit": 10}).json()
    rest = follow(client, "/api/teams/Big/members", {"cursor": detail["members_next_cursor"], "limit": 500})
    assert [m["username"] for m in detail["member_list"]] + [m["username"] for m in rest[0]] == named

    refuses_bad_paging(client, "/api/teams/Big/members", teams.MEMBERS_MAX_LIMIT)
    assert client.get("/api/teams/nobody/members").status_code == 404


def test_the_experiments_a_team_helped_come_in_pages_with_its_rank_in_each(client, db):
    """GET /api/teams/NAME/experiments: 100 a page unless asked, most verified first (ties by slug), drafts left
    out, each with the team's share and rank among the experiment's teams; the team's page shows the first page
    and links to the next."""
    olga = make_user(db, "olga")
    count = teams.TEAM_EXPERIMENTS_LIMIT + MORE
    slugs = [f"run-{i:03d}" for i in range(count)]
    ids = experiments_like(db, olga, slugs)
    draft = experiments_like(db, olga, ["draft-run"], status="draft")["draft-run"]
    mine = {slug: 10 * (i % 7) + 10 for i, slug in enumerate(slugs)}  # seven values, many ties
    # Rivals: ahead where they have more, behind on a tie ("crew" < "rivals" whatever the case), absent elsewhere
    rivals = {slug: mine[slug] + (5 if i % 3 == 0 else 0) for i, slug in enumerate(slugs) if i % 3 != 2}
    with db.begin() as session:
        ann, bob, rex = user(session, "ann"), user(session, "bob"), user(session, "rex")
        team_of(session, "Crew", [ann, bob])
        team_of(session, "Rivals", [rex])
        for slug, experiment_id in ids.items():
            verified(session, experiment_id, ann, mine[slug] - 5)
            verified(session, experiment_id, bob, 5)
            if slug in rivals:
                verified(session, experiment_id, rex, rivals[slug])
            total = mine[slug] + rivals.get(slug, 0)
            session.add(ExperimentTotal(experiment_id=experiment_id, verified_samples=total))
        verified(session, draft, ann, 1000)  # a draft counts nowhere
    order = sorted(slugs, key=lambda slug: (-mine[slug], slug))

    def expected(slug: str) -> dict[str, Any]:
        total = mine[slug] + rivals.get(slug, 0)
        return {
            "slug": slug,
            "title": f"Experiment {slug}",
            "url": f"/experiments/{slug}",
            "verified_samples": mine[slug],
            "share": round(mine[slug] / total, 4),
            "rank": 2 if rivals.get(slug, 0) > mine[slug] else 1,
        }

    pages = follow(client, "/api/teams/crew/experiments")
    assert [len(page) for page in pages] == [teams.TEAM_EXPERIMENTS_LIMIT, MORE]  # bounded by default
    assert [e for page in pages for e in page] == [expected(slug) for slug in order]
    small = follow(client, "/api/teams/Crew/experiments", {"limit": 45})
    assert [e["slug"] for page in small for e in page] == order
    # the ranks are the experiment's own standings
    for slug in (order[0], order[-1]):
        standings = client.get(f"/api/experiments/{slug}/teams").json()
        assert [t["name"] for t in standings].index("Crew") + 1 == expected(slug)["rank"]

    detail = client.get("/api/teams/Crew").json()
    assert [e["slug"] for e in detail["experiments"]] == order[: teams.TEAM_EXPERIMENTS_LIMIT]
    assert detail["experiments_total"] == count
    rest = client.get("/api/teams/Crew", params={"experiments_cursor": detail["experiments_next_cursor"]}).json()
    assert [e["slug"] for e in rest["experiments"]] == order[teams.TEAM_EXPERIMENTS_LIMIT :]
    assert rest["experiments_next_cursor"] is None
    bad = client.get("/api/teams/Crew", params={"experiments_cursor": "nonsense"})
    assert bad.status_code == 400 and bad.json()["field"] == "experiments_cursor"
    refuses_bad_paging(client, "/api/teams/Crew/experiments", teams.TEAM_EXPERIMENTS_MAX_LIMIT)

    page = client.get("/teams/Crew")
    assert page.status_code == 200 and page.text.count("<tr data-slug=") == teams.TEAM_EXPERIMENTS_LIMIT
    more = html.unescape(page.text.split('id="more-experiments" href="')[1].split('"')[0])
    second = client.get(more)
    assert second.status_code == 200 and 'id="more-experiments"' not in second.text
    assert [s for s in slugs if f'data-slug="{s}"' in second.text] == sorted(order[teams.TEAM_EXPERIMENTS_LIMIT :])


def test_an_experiments_teams_come_in_pages_with_their_ranks(client, db):
    """GET /api/experiments/SLUG/teams: 100 a page unless asked, most verified first (ties by name whatever the
    case), ``rank`` the place among all of them; the dashboard's Teams table shows the first page and links on."""
    olga = make_user(db, "olga")
    alpha = make_experiment(db, olga, slug="alpha", status="running")
    count = teams.TEAMS_LIMIT + MORE
    names = [f"{'T' if i % 2 else 't'}eam{i:03d}" for i in range(count)]  # case mixed: ordered whatever the case
    figures = {name: 10 * (i % 9) for i, name in enumerate(names)}  # nine values, many ties
    with db.begin() as session:
        for name in names:
            lead = user(session, f"lead{name.lower()}")
            team_of(session, name, [lead])
            verified(session, alpha.id, lead, figures[name] + 1)
        session.add(ExperimentTotal(experiment_id=alpha.id, verified_samples=sum(figures.values()) + count))
    order = sorted(names, key=lambda name: (-figures[name], name.lower()))

    pages = follow(client, "/api/experiments/alpha/teams")
    assert [len(page) for page in pages] == [teams.TEAMS_LIMIT, MORE]  # bounded by default
    rows = [row for page in pages for row in page]
    assert [(row["rank"], row["name"]) for row in rows] == list(enumerate(order, 1))
    assert rows[0]["verified_samples"] == 81 and rows[0]["contributors"] == 1 and rows[0]["url"] == f"/teams/{order[0]}"
    small = follow(client, "/api/experiments/alpha/teams", {"limit": 7})
    assert [row for page in small for row in page] == rows
    refuses_bad_paging(client, "/api/experiments/alpha/teams", teams.TEAMS_MAX_LIMIT)

    dashboard = client.get("/experiments/alpha")
    assert dashboard.status_code == 200 and dashboard.text.count("<tr data-team=") == teams.TEAMS_LIMIT
    more = html.unescape(dashboard.text.split('id="more-teams" href="')[1].split('"')[0])
    second = client.get(more)
    assert second.status_code == 200 and 'id="more-teams"' not in second.text
    shown = [name for name in names if f'<tr data-team="{name}"><td>{order.index(name) + 1}</td>' in second.text]
    assert sorted(shown) == sorted(order[teams.TEAMS_LIMIT :])
    assert client.get("/experiments/alpha", params={"teams_cursor": "nonsense"}).status_code == 400
