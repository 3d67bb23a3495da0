"""Exactly one server process hosts each running experiment's swarm peers: a lease row per run_id.

Every process's reconcile loop (every ``swarm_reconcile_seconds``) renews the leases it holds and takes any that
are free or expired; a process that dies stops renewing, and another takes its experiments over once the lease
expires: within ``swarm_lease_seconds`` (LEASE_SECONDS by default) + one reconcile interval. The holder also
writes its bootstrap addresses and the swarm's peer count into the row, so that any process can answer a join.

Lease times are read on the database's clock (:func:`db_now`), not each replica's: a replica whose clock runs
ahead would otherwise see every other's lease as expired and take it, and one whose clock lags would hold a lease
past its expiry in the others' eyes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from sqlalchemy import DateTime, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from swarmhub.server.models import SwarmLease, utcnow

LEASE_SECONDS = 15.0


def db_now(session: Session) -> datetime:
    """The database's clock: PostgreSQL's ``statement_timestamp()``, shared by every replica. A SQLite file is
    opened by the processes of one machine only, whose clock is the database's."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(select(func.statement_timestamp(type_=DateTime(timezone=True))))
        if now is not None:
            return now
    return utcnow()


def acquire(
    session: Session, run_id: str, holder: str, now: datetime | None = None, seconds: float = LEASE_SECONDS
) -> bool:
    """Take or renew the lease for ``run_id`` for ``seconds``; True when ``holder`` has it now (atomic on both
    databases). ``now`` is the database's clock unless given."""
    now = now or db_now(session)
    expires = now + timedelta(seconds=seconds)
    renewed = session.execute(
        update(SwarmLease)
        .where(SwarmLease.run_id == run_id, SwarmLease.holder == holder)
        .values(expires_at=expires)
        .execution_options(synchronize_session=False)
    )
    if renewed.rowcount:  # type: ignore[attr-defined]
        return True
    taken = session.execute(  # an expired lease: its holder died; the old addresses go with it
        update(SwarmLease)
        .where(SwarmLease.run_id == run_id, SwarmLease.expires_at < now)
        .values(holder=holder, expires_at=expires, maddrs=[], peers=None)
        .execution_options(synchronize_session=False)
    )
    if taken.rowcount:  # type: ignore[attr-defined]
        return True
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    created = session.execute(  # RETURNING, not rowcount: psycopg reports -1 for this INSERT
        insert(SwarmLease)
        .values(run_id=run_id, holder=holder, expires_at=expires, maddrs=[], peers=None)
        .on_conflict_do_nothing(index_elements=["run_id"])
        .returning(SwarmLease.run_id)
    )
    return created.scalar_one_or_none() is not None


def publish(session: Session, run_id: str, holder: str, maddrs: list[str], peers: int | None) -> None:
    session.execute(
        update(SwarmLease)
        .where(SwarmLease.run_id == run_id, SwarmLease.holder == holder)
        .values(maddrs=maddrs, peers=peers)
        .execution_options(synchronize_session=False)
    )


def publish_peer_states(session: Session, run_id: str, holder: str, states: list[dict[str, object]]) -> None:
    """The holder's peer processes for ``run_id`` (``swarm.supervision.PeerState`` as JSON)."""
    session.execute(
        update(SwarmLease)
        .where(SwarmLease.run_id == run_id, SwarmLease.holder == holder)
        .values(server_peers=states)
        .execution_options(synchronize_session=False)
    )


def release(session: Session, run_ids: list[str], holder: str) -> None:
    """Give leases up (the experiment stopped, or this process shuts down): another may take them at once."""
    if run_ids:
        session.execute(delete(SwarmLease).where(SwarmLease.run_id.in_(run_ids), SwarmLease.holder == holder))


def current(session: Session, run_id: str, now: datetime | None = None) -> SwarmLease | None:
    """The live lease of ``run_id``, if a process holds one."""
    query = select(SwarmLease).where(SwarmLease.run_id == run_id)
    if now is None and session.get_bind().dialect.name == "postgresql":  # the database's clock, in the same query
        return session.scalar(query.where(SwarmLease.expires_at >= func.statement_timestamp()))
    lease = session.scalar(query)
    return lease if lease is not None and lease.expires_at >= (now or utcnow()) else None


class AddressWatch:
    """The bootstrap addresses of runs that joins are waiting for, read from the lease rows at most once per
    ``interval`` per run however many joins wait: thirty joins waiting for a starting swarm make one query every
    0.2 s, not thirty (their polling used to compete with the hub's pages for the database)."""

    def __init__(self, sessionmaker: Callable[[], Session], interval: float = 0.2):
        self._sessionmaker = sessionmaker
        self._interval = interval
        self._lock = threading.Lock()
        self._read: dict[str, tuple[float, list[str]]] = {}  # run_id -> (when read, addresses)

    def addresses(self, run_id: str) -> list[str]:
        """The run's bootstrap addresses, [] while no process holds its lease with addresses written."""
        with self._lock:  # one reader at a time: a waiting join takes the read another made a moment ago
            now = time.monotonic()
            read = self._read.get(run_id)
            if read is not None and now - read[0] < self._interval:
                return list(read[1])
            with self._sessionmaker() as session:
                lease = current(session, run_id)
                maddrs = list(lease.maddrs) if lease is not None and lease.maddrs else []
            for stale in [run for run, (when, _) in self._read.items() if now - when > 60]:
                del self._read[stale]  # bounded: runs nobody asked about for a minute are forgotten
            self._read[run_id] = (time.monotonic(), maddrs)
            return list(maddrs)

    def wait(self, run_id: str, timeout: float) -> list[str]:
        """The run's bootstrap addresses once there are some, [] after ``timeout`` seconds without."""
        deadline = time.monotonic() + timeout
        while True:
            maddrs = self.addresses(run_id)
            if maddrs or time.monotonic() >= deadline:
                return maddrs
            time.sleep(min(self._interval, max(deadline - time.monotonic(), 0.0)))
