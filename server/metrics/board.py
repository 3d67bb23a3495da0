"""The leaderboard: its pages by offset or by cursor, read from the volunteers' running totals through their
ranking index, and for the organizer the flags on claims the swarm's signed records do not back."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, Field, TypeAdapter
from sqlalchemy import BigInteger, Integer, Row, Select, Text, and_, bindparam, func, select, tuple_, union_all
from sqlalchemy import cast as cast_
from sqlalchemy.orm import Session

from swarmhub.server.community import volunteers
from swarmhub.server.core import cursors
from swarmhub.server.core.security import StoredText
from swarmhub.server.ledger import contributions, milestones
from swarmhub.server.metrics.common import (
    RUNS_TABLE,
    TOTALS_TABLE,
    USERS_TABLE,
    VOLUNTEERS_TABLE,
    active_since,
    share_of,
)
from swarmhub.server.models import Experiment

# A claim is implausible when it is this far above what the swarm's signed records show.
CLAIM_SLACK = 0.25  # claimed samples over verified + pending, beyond the reporting lag
THROUGHPUT_FACTOR = 3.0  # claimed peak rate over the fastest signed rate of the same device class
# A volunteer's own signed peak over the fastest other peer of their classes: honest devices of one class can
# differ several times over (a laptop and a workstation are both "cpu"), so only an order of magnitude is flagged
SIGNED_FACTOR = 10.0

LEADERBOARD_LIMIT = 100  # rows of a page unless asked otherwise; what dashboards show
LEADERBOARD_MAX_LIMIT = 1000
# The API serves offsets up to here; deeper pages follow the cursor. An offset page walks the board's index up to
# it, so its cost grows with the offset (a cursor page's does not): the window bounds every page's cost.
LEADERBOARD_MAX_OFFSET = 10_000


class LeaderboardEntry(BaseModel):
    rank: int
    username: str
    samples: int = Field(description="Verified: in the swarm's signed records, in epochs the swarm has closed")
    pending_samples: int = Field(description="In signed records of the epoch still open")
    claimed_samples: int = Field(description="What the volunteer's workers reported over the websocket")
    share: float = Field(description="Fraction of all verified samples of the run")
    profile_url: str | None = Field(default=None, description="The volunteer's public page; null when they hid it")
    samples_per_second: float
    time_online_seconds: float = Field(description="Time the swarm saw this volunteer's peers publish records")
    active: bool
    last_seen: datetime | None
    flags: list[str] | None = Field(
        default=None, description="Implausible claims, for the experiment's organizer only (null for others)"
    )
    milestones: list[str] = Field(
        default_factory=list,
        description="Keys of the volunteer's milestones, hub-wide (see the profile); empty when they hid their profile",
    )


class Cursor(NamedTuple):
    """Where a leaderboard page ended (its last row's rank and sort key): the next page is the rows after it.
    Clients get it as opaque text (base64 of the JSON array) and only hand it back."""

    rank: Annotated[int, Field(ge=1, le=2**62)]
    verified: Annotated[int, Field(ge=0, le=2**62)]
    claimed: Annotated[int, Field(ge=0, le=2**62)]
    sort_name: Annotated[StoredText, Field(max_length=32)]
    user_id: Annotated[int, Field(ge=0, le=2**62)]

    def encode(self) -> str:
        return cursors.encode(_CURSOR, self)

    @staticmethod
    def decode(text: str) -> Cursor:
        """The cursor a page returned; a 400 naming ``cursor`` for anything else."""
        return cursors.decode(_CURSOR, text, "cursor", "not a cursor this leaderboard returned")

    @staticmethod
    def of(rank: int, row: TotalRow) -> Cursor:
        return Cursor(rank, row.verified_samples, row.claimed_samples, row.sort_name, row.user_id)


_CURSOR = TypeAdapter(Cursor)


class LeaderboardPage(BaseModel):
    entries: list[LeaderboardEntry]
    next_cursor: str | None = Field(description="Pass as ?cursor= for the next page; null on the last page")


# A page's totals are read as plain rows (attribute access by column name), not as ORM objects: building and
# tracking 100 mapped objects was most of a page's time in Python.
TotalRow = Row[Any]


def _rank_order(columns: Any) -> list[Any]:
    # The order of ix_volunteer_totals_rank, so that a page is an index range that stops at the page.
    return [columns.verified_samples.desc(), columns.claimed_samples.desc(), columns.sort_name, columns.user_id]


# What a page's rows carry: the entry's columns, and for the organizer's flags the peaks, classes and epochs too
# (the device classes are JSON: only read where used, and decoded once per distinct set, device_classes_of).
_ENTRY_COLUMNS = (
    "user_id",
    "sort_name",
    "verified_samples",
    "pending_samples",
    "claimed_samples",
    "online_seconds",
    "last_report_at",
    "last_signed_at",
)
_FLAG_COLUMNS = (
    *_ENTRY_COLUMNS,
    "epochs",
    "device_classes",
    "peak_claimed_samples_per_second",
    "peak_signed_samples_per_second",
    "swarm_flags",
)
# An offset from here on walks the index alone to the page (an index-only scan of the rank keys), then reads
# the page's rows; below it, reading the rows as the index gives them is cheaper than the second lookup. The two
# were even at 500 on bench/queries.py's build (4.1 ms each; 3.7 against 4.5 ms at 0, 4.8 against 4.2 at 1,000).
KEYS_ONLY_FROM = 500


def _page_statement(kind: str, with_flags: bool) -> Select[Any]:
    """A page in one statement, of one kind: ``top`` (``limit`` rows from a small ``offset``), ``deep`` (from a
    large one) or ``after`` (after a cursor: ``verified``, ``claimed``, ``sort_name``, ``user_id``). Then for the
    page's rows only their names and current rates (a rate is a worker's while it reports: the sum over the
    volunteer's runs seen since ``since``), and the experiment's totals beside every row. Built once per kind
    (its values are bound parameters), so a request does not build a statement."""
    volunteer = VOLUNTEERS_TABLE.c
    experiment_id = bindparam("experiment_id", type_=Integer)
    limit, offset = bindparam("limit", type_=Integer), bindparam("offset", type_=Integer)
    names = _FLAG_COLUMNS if with_flags else _ENTRY_COLUMNS

    def ranked(*columns: Any) -> Select[Any]:  # the order of ix_volunteer_totals_rank: a range of the index
        return select(*columns).where(volunteer.experiment_id == experiment_id).order_by(*_rank_order(volunteer))

    if kind == "deep":
        # rank keys only (every column one of the index's), then the page's rows by their primary key
        page = (
            ranked(volunteer.user_id, volunteer.verified_samples, volunteer.claimed_samples, volunteer.sort_name)
            .limit(limit)
            .offset(offset)
            .subquery("page")
        )
        columns: list[Any] = [volunteer[name] for name in names]
        source: Any = page.join(
            VOLUNTEERS_TABLE, and_(volunteer.experiment_id == experiment_id, volunteer.user_id == page.c.user_id)
        )
    else:
        rows = [volunteer[name] for name in names]
        if kind == "top":
            page = ranked(*rows).limit(limit).offset(offset).subquery("page")
        else:
            # The board's order mixes descending totals with ascending names, so "after" is no single index
            # range; it is three, each read up to ``limit`` rows, merged in order: the same totals and a later
            # name, the same verified samples and fewer claimed, then fewer verified.
            verified, claimed = bindparam("verified", type_=BigInteger), bindparam("claimed", type_=BigInteger)
            later = tuple_(volunteer.sort_name, volunteer.user_id) > tuple_(
                bindparam("sort_name", type_=volunteer.sort_name.type), bindparam("user_id", type_=Integer)
            )
            ranges = [
                (volunteer.verified_samples == verified, volunteer.claimed_samples == claimed, later),
                (volunteer.verified_samples == verified, volunteer.claimed_samples < claimed),
                (volunteer.verified_samples < verified,),
            ]
            parts = [ranked(*rows).where(*condition).limit(limit).subquery() for condition in ranges]
            merged = union_all(*(select(part) for part in parts)).subquery("after")
            page = select(merged).order_by(*_rank_order(merged.c)).limit(limit).subquery("page")
        columns = [page.c[name] for name in names]
        source = page
    # as text, decoded through a cache: a board holds a few distinct sets of classes, not one per row
    columns = [cast_(c, Text).label(c.name) if c.name == "device_classes" else c for c in columns]
    run, totals = RUNS_TABLE.c, TOTALS_TABLE.c
    rate = select(func.sum(run.samples_per_second)).where(
        run.experiment_id == experiment_id, run.user_id == page.c.user_id, run.last_seen_at >= bindparam("since")
    )
    # scalar subqueries: a value (or null) even before the experiment has totals
    columns += [
        USERS_TABLE.c.username,
        USERS_TABLE.c.profile_hidden,
        rate.scalar_subquery().label("rate"),
        select(totals.verified_samples)
        .where(totals.experiment_id == experiment_id)
        .scalar_subquery()
        .label("total_verified"),
    ]
    if with_flags:  # as text: parsed once, not once per row
        peaks = select(cast_(totals.signed_peaks, Text)).where(totals.experiment_id == experiment_id)
        columns.append(peaks.scalar_subquery().label("signed_peaks"))
    return (
        select(*columns)
        .select_from(source)
        .join(USERS_TABLE, USERS_TABLE.c.id == page.c.user_id)
        .order_by(*_rank_order(page.c))
    )


_PAGES = {(kind, flags): _page_statement(kind, flags) for kind in ("top", "deep", "after") for flags in (False, True)}


def leaderboard(
    session: Session,
    experiment: Experiment,
    window_seconds: int,
    *,
    with_flags: bool = False,
    limit: int = LEADERBOARD_LIMIT,
    offset: int = 0,
) -> list[LeaderboardEntry]:
    """One page of the volunteers (see :func:`leaderboard_page`), by offset."""
    return leaderboard_page(
        session, experiment, window_seconds, with_flags=with_flags, limit=limit, offset=offset
    ).entries


def leaderboard_page(
    session: Session,
    experiment: Experiment,
    window_seconds: int,
    *,
    with_flags: bool = False,
    limit: int = LEADERBOARD_LIMIT,
    offset: int = 0,
    after: Cursor | None = None,
) -> LeaderboardPage:
    """One page of the volunteers by verified samples (then claimed, then name), with what they claimed beside
    it; ``rank`` is the place on the whole board. ``with_flags`` adds the organizer's view of implausible
    claims. Reads the running totals (``VolunteerTotal``) through their ranking index, in one statement: the
    cost is the page's, not the number of volunteers or reports, when the page starts ``after`` a cursor; an
    ``offset`` walks the index (the index alone) up to the page. The page's cursor leads to the next page."""
    since = active_since(window_seconds)
    params: dict[str, Any] = {"experiment_id": experiment.id, "since": since, "limit": limit + 1}
    if after is not None:
        kind = "after"
        params.update(verified=after.verified, claimed=after.claimed, sort_name=after.sort_name, user_id=after.user_id)
        first_rank = after.rank + 1
    else:
        kind = "deep" if offset >= KEYS_ONLY_FROM else "top"
        params["offset"] = offset
        first_rank = offset + 1
    rows = session.execute(_PAGES[kind, with_flags], params).all()
    more, rows = len(rows) > limit, rows[:limit]
    if not rows:
        return LeaderboardPage(entries=[], next_cursor=None)
    next_cursor = Cursor.of(first_rank + len(rows) - 1, rows[-1]).encode() if more else None
    total_verified = rows[0].total_verified or 0
    references = (
        _ClassReferences(session, experiment.id, json.loads(rows[0].signed_peaks or "{}")) if with_flags else None
    )
    # one statement for the page's visible profiles, not one per row (a hidden profile shows none)
    reached = milestones.keys_for(session, [row.user_id for row in rows if not row.profile_hidden])
    board = []
    for rank, row in enumerate(rows, start=first_rank):
        seen = [t for t in (row.last_report_at, row.last_signed_at) if t is not None]
        last_seen = max(seen) if seen else None
        board.append(
            LeaderboardEntry(
                rank=rank,
                username=row.username,
                samples=row.verified_samples,
                pending_samples=row.pending_samples,
                claimed_samples=row.claimed_samples,
                share=share_of(row.verified_samples, total_verified),
                profile_url=None if row.profile_hidden else volunteers.profile_path(row.username),
                samples_per_second=round(float(row.rate or 0.0), 2),
                time_online_seconds=round(row.online_seconds, 1),
                active=last_seen is not None and last_seen >= since,
                last_seen=last_seen,
                flags=_flags(experiment, row, references) if references is not None else None,
                milestones=reached.get(row.user_id, []),
            )
        )
    return LeaderboardPage(entries=board, next_cursor=next_cursor)


@lru_cache(maxsize=4096)
def device_classes_of(text: str | None) -> tuple[str, ...]:
    """A volunteer's device classes, sorted, from the column's JSON text."""
    return tuple(sorted(json.loads(text))) if text else ()


# The fastest signed rates here, through ix_volunteer_totals_signed_peak
_FASTEST = (
    select(
        VOLUNTEERS_TABLE.c.peak_signed_samples_per_second,
        VOLUNTEERS_TABLE.c.user_id,
        cast_(VOLUNTEERS_TABLE.c.device_classes, Text),
    )
    .where(
        VOLUNTEERS_TABLE.c.experiment_id == bindparam("experiment_id", type_=Integer),
        VOLUNTEERS_TABLE.c.peak_signed_samples_per_second > 0,
    )
    .order_by(VOLUNTEERS_TABLE.c.peak_signed_samples_per_second.desc())
    .limit(bindparam("scan", type_=Integer))
)


class _ClassReferences:
    """The fastest signed rate of each device class here (kept in the experiment's totals), and, for the
    volunteer who holds it, the runner-up: the fastest signed rate of *another* volunteer of the class, so that
    inflated signed records are not their own yardstick. The runner-ups of every class come from one read of the
    fastest volunteers through the index on the signed peak (a few rows), made once per page and only when a
    volunteer on it holds a class's peak."""

    SCAN = 50  # rows of the fastest volunteers looked through for the classes' two fastest

    def __init__(self, session: Session, experiment_id: int, fastest: dict[str, float]):
        self.session = session
        self.experiment_id = experiment_id
        self.fastest = fastest
        self._leaders: dict[str, list[tuple[float, int]]] | None = None  # class -> its two fastest (peak, user)

    def others(self, cls: str, row: TotalRow) -> float:
        fastest = self.fastest.get(cls, 0.0)
        if row.peak_signed_samples_per_second < fastest:
            return fastest  # someone else holds the class's peak
        if self._leaders is None:
            self._leaders = {}
            fastest_rows = self.session.execute(_FASTEST, {"experiment_id": self.experiment_id, "scan": self.SCAN})
            for peak, user_id, classes in fastest_rows:
                for each in device_classes_of(classes):
                    leaders = self._leaders.setdefault(each, [])
                    if len(leaders) < 2:
                        leaders.append((peak, user_id))
        # Tied at the peak, the other holder is the runner-up: the same rate.
        return next((peak for peak, user_id in self._leaders.get(cls, []) if user_id != row.user_id), 0.0)


def _flags(experiment: Experiment, row: TotalRow, references: _ClassReferences) -> list[str]:
    """Claims the signed records do not back: samples that never reached an averaging round, a reported rate
    far above what peers of the same device class were seen to do here, and signed records whose rate is far
    above every other peer of the class."""
    flags = []
    backed = row.verified_samples + row.pending_samples
    # What the monitor cannot have seen: each epoch's last moments at the peer's rate, plus reporting lag. The rate
    # is the one the peer signed, which a modified worker sets as it likes: an epoch's unseen tail is at most one
    # target batch, however fast the peer says it is (an epoch ends when the swarm has gathered that many).
    tail = min(contributions.MONITOR_SECONDS * row.peak_signed_samples_per_second, experiment.target_batch_size)
    unseen = row.epochs * tail
    if row.claimed_samples > backed * (1 + CLAIM_SLACK) + unseen + 2 * experiment.target_batch_size:
        flags.append(
            f"claims {row.claimed_samples:,} samples but the swarm's signed records show {backed:,}: "
            "the rest never reached an averaging round"
        )
    claimed, signed = row.peak_claimed_samples_per_second, row.peak_signed_samples_per_second
    classes = device_classes_of(row.device_classes)
    for cls in classes:
        fastest = references.fastest.get(cls, 0.0)
        if fastest > 0 and claimed > THROUGHPUT_FACTOR * fastest:
            flags.append(
                f"reported {claimed:,.0f} samples/s; the fastest signed rate of a {cls} peer here is {fastest:,.0f}"
            )
    # The signed peak may come from any of the volunteer's devices: held against the most capable of their
    # classes, and only when every one of them has another peer to compare with.
    others = [references.others(cls, row) for cls in classes] if signed > 0 else []
    if others and min(others) > 0 and signed > SIGNED_FACTOR * max(others):
        flags.append(
            f"signed records show {signed:,.0f} samples/s; no other {'/'.join(classes)} peer here signed more "
            f"than {max(others):,.0f}"
        )
    if row.swarm_flags:
        flags.append(
            f"the server's peers refused data from their peers {row.swarm_flags:,} times (non-finite gradients, an "
            "epoch ahead of the swarm, a poisoned state, or a weight claimed far over the target batch)"
        )
    return flags
