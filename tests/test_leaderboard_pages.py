"""Keyset pages of the leaderboard: following ``Next-Cursor`` (or the ``Link`` header) from the first page shows
every volunteer exactly once, in the board's order, ties included, with the absolute rank, on both databases."""

from __future__ import annotations

import itertools

import pytest

from swarmhub.server import metrics
from swarmhub.server.models import User, VolunteerTotal

from .conftest import make_experiment, make_user

pytestmark = pytest.mark.both_databases  # the leaderboard's order depends on collation

# (name, verified, claimed): ties on verified, on verified and claimed, and names that differ only in case order
BOARD = [
    ("zed", 50, 10),
    ("Amy", 50, 10),
    ("bob", 50, 10),
    ("cat", 50, 30),
    ("dan", 50, 5),
    ("eve", 70, 0),
    ("fay", 0, 0),
    ("gus", 0, 0),
    ("Hal", 0, 90),
    ("ivy", 20, 10),
    ("jo", 20, 10),
    ("kim", 20, 11),
    ("lee", 0, 90),
]
ORDER = [name for name, *_ in sorted(BOARD, key=lambda row: (-row[1], -row[2], row[0].lower()))]


@pytest.fixture
def board(client, db):
    """A running experiment whose volunteer totals are BOARD; returns its leaderboard's path."""
    experiment = make_experiment(db, make_user(db, "olga"), slug="board", status="running")
    users = {name: make_user(db, name) for name, *_ in BOARD}
    with db.begin() as session:
        for name, verified, claimed in BOARD:
            session.add(
                VolunteerTotal(
                    experiment_id=experiment.id,
                    user_id=users[name].id,
                    sort_name=name.lower(),
                    verified_samples=verified,
                    claimed_samples=claimed,
                )
            )
    return "/api/experiments/board/leaderboard"


def follow(client, path, limit, first=None):
    """Every page from the first (or ``first``'s params), by Next-Cursor; returns the pages."""
    pages = []
    response = client.get(path, params=first or {"limit": limit})
    while True:
        assert response.status_code == 200, response.text
        pages.append(response.json())
        cursor = response.headers.get("next-cursor")
        if cursor is None:
            assert "link" not in response.headers
            return pages
        response = client.get(path, params={"limit": limit, "cursor": cursor})


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 12, 13, 100])
def test_cursor_pages_cover_every_volunteer_once_in_order(client, board, limit):
    pages = follow(client, board, limit)
    rows = list(itertools.chain.from_iterable(pages))
    assert [r["username"] for r in rows] == ORDER
    assert [r["rank"] for r in rows] == list(range(1, len(ORDER) + 1))
    assert all(len(page) == limit for page in pages[:-1]) and 0 < len(pages[-1]) <= limit
    assert len(pages) == -(-len(ORDER) // limit)  # no empty page at the end, even when the last one is full
    assert rows == client.get(board, params={"limit": 1000}).json()


def test_the_link_header_leads_to_the_next_page(client, board):
    response = client.get(board, params={"limit": 4})
    seen = []
    while True:
        seen += [r["username"] for r in response.json()]
        if "link" not in response.headers:
            break
        target, rel = response.headers["link"].split("; ")
        assert rel == 'rel="next"' and target.startswith("</api/experiments/board/leaderboard?")
        response = client.get(target.strip("<>"))
    assert seen == ORDER


def test_an_offset_page_hands_over_to_cursors(client, board):
    pages = follow(client, board, 4, first={"limit": 4, "offset": 5})
    rows = list(itertools.chain.from_iterable(pages))
    assert [r["username"] for r in rows] == ORDER[5:]
    assert [r["rank"] for r in rows] == list(range(6, len(ORDER) + 1))


def test_a_volunteer_who_climbs_between_pages_shows_nobody_twice(client, db, board):
    """With offsets, someone climbing above the page boundary pushes the last volunteer of the page already read
    onto the next one: shown twice. A cursor continues after the last row shown."""
    first = client.get(board, params={"limit": 4})
    assert [r["username"] for r in first.json()] == ORDER[:4]
    climber = ORDER[8]
    with db.begin() as session:
        row = session.query(VolunteerTotal).filter(VolunteerTotal.sort_name == climber.lower()).one()
        row.verified_samples = 1000
    rest = follow(client, board, 4, first={"limit": 4, "cursor": first.headers["next-cursor"]})
    names = [r["username"] for r in itertools.chain.from_iterable(rest)]
    assert names == [name for name in ORDER[4:] if name != climber]
    by_offset = client.get(board, params={"limit": 4, "offset": 4}).json()
    assert by_offset[0]["username"] == ORDER[3]  # what offsets do: the first page's last row again


def test_bad_cursors_are_refused_with_the_field_named(client, board):
    cursor = client.get(board, params={"limit": 2}).headers["next-cursor"]
    for params in ({"cursor": "not-a-cursor"}, {"cursor": "W10"}, {"cursor": "é"}, {"cursor": "bad\x00"}):
        bad = client.get(board, params=params)
        assert bad.status_code == 400 and bad.json()["field"] == "cursor", params
    both = client.get(board, params={"cursor": cursor, "offset": 2})
    assert both.status_code == 400 and both.json()["field"] == "offset"
    # offsets stop at the window (a page by offset costs a walk up to it): deeper pages follow the cursor
    window = metrics.LEADERBOARD_MAX_OFFSET
    assert client.get(board, params={"offset": window}).json() == []
    too_deep = client.get(board, params={"offset": window + 1})
    assert too_deep.status_code == 400 and too_deep.json()["field"] == "offset"
    assert "Next-Cursor" in too_deep.json()["detail"]
    assert client.get(board, params={"cursor": "x" * 201}).status_code == 422


def test_deep_offsets_read_the_same_pages_as_the_first_ones(client, db):
    """From ``metrics.KEYS_ONLY_FROM`` on, an offset walks the index's rank keys alone and reads the page's rows
    after: the pages around that switch, far past it and with the organizer's flags equal the board's order."""
    deep = metrics.KEYS_ONLY_FROM
    owner = make_user(db, "olga")
    experiment = make_experiment(db, owner, slug="wide", status="running")
    count = deep + 150
    with db.begin() as session:  # users written directly: hashing a password for each would take minutes
        users = [User(username=f"v{i:04d}", password_hash="-", is_admin=False) for i in range(count)]
        session.add_all(users)
        session.flush()
        for i, user in enumerate(users):  # ties on verified and claimed, names out of id order
            session.add(
                VolunteerTotal(
                    experiment_id=experiment.id,
                    user_id=user.id,
                    sort_name=f"v{(i * 7919) % count:04d}",
                    verified_samples=(i % 37) * 10,
                    claimed_samples=(i % 5) * 3,
                )
            )
    with db() as session:
        totals = session.query(VolunteerTotal).filter_by(experiment_id=experiment.id).all()
        names = {user.id: user.username for user in session.query(User)}
        order = [
            names[t.user_id]
            for t in sorted(totals, key=lambda t: (-t.verified_samples, -t.claimed_samples, t.sort_name, t.user_id))
        ]
        exp = session.merge(experiment)
        for offset in (0, deep - 60, deep - 1, deep, deep + 1, count - 30):
            for with_flags in (False, True):
                page = metrics.leaderboard_page(session, exp, 30, limit=60, offset=offset, with_flags=with_flags)
                assert [e.username for e in page.entries] == order[offset : offset + 60], (offset, with_flags)
                assert [e.rank for e in page.entries] == list(range(offset + 1, offset + 1 + len(page.entries)))
                assert all((e.flags is not None) == with_flags for e in page.entries)
                assert (page.next_cursor is None) == (offset + 60 >= count)
    # the API's pages by offset (deep ones included) are the same rows as following its cursors
    path = "/api/experiments/wide/leaderboard"
    by_cursor = list(itertools.chain.from_iterable(follow(client, path, 200)))
    assert [r["username"] for r in by_cursor] == order
    for offset in (deep - 1, deep + 7):
        response = client.get(path, params={"limit": 100, "offset": offset})
        assert response.json() == by_cursor[offset : offset + 100]
