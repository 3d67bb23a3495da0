"""Dashboard and leaderboard queries at scale: running totals against the scan-based computation they replace.

Builds a PostgreSQL database with many volunteers and metric points (set-based SQL over ``generate_series``, at
schema revision 0007), upgrades it to the newest revision (so the running-totals and metric-bucket migrations
backfill the bulk data), drives a sample of volunteers through the real ``metrics.ingest`` and
``contributions.record`` (reports, a duplicate, epochs closing, a late read of a closed epoch), checks that every
volunteer's and the experiment's totals equal a recount from the stored rows, that the pages equal the
reference's and that the newest metric buckets equal a recount from their reports, then times, through the real
functions and in the same run, the leaderboard (first page, the deepest page the API serves by offset, a deep
page by offset and by cursor, the organizer's first page with flags), the summary, the series and a whole live
snapshot, beside ``Reference``: a copy of the scan-based computation (before running totals and metric buckets)
kept here as the baseline. Target: <= 20 ms each (median and p95).

    .venv/bin/python bench/queries.py            # 100,000 volunteers, 10,000,000 metric points
    .venv/bin/python bench/queries.py --quick    # 2,000 volunteers, 200,000 metric points
    .venv/bin/python bench/queries.py --only leaderboard   # the same build; times the leaderboard's pages only

The full run waits while /tmp/swarmhub-bench-running exists (another benchmark), then holds it. The database
(``swarmhub_bench_queries``) is dropped at the end unless ``--keep``; ``--reuse`` times against the database a
``--keep`` run left, without building it again (about 5 minutes saved), and keeps it.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from alembic import command
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from swarmhub.common import tokens as swarm_tokens
from swarmhub.common.protocol import MetricReport
from swarmhub.server import experiments, metrics
from swarmhub.server.community import volunteers
from swarmhub.server.core import security
from swarmhub.server.core.db import alembic_config, make_engine, make_sessionmaker
from swarmhub.server.core.settings import Settings
from swarmhub.server.ledger import contributions, milestones
from swarmhub.server.live.snapshots import dashboard_snapshot
from swarmhub.server.models import Experiment, MetricBucket, MetricPoint, PeerEpoch, User, WorkerRun, utcnow

ROOT = Path(__file__).resolve().parent.parent
LOCK = Path("/tmp/swarmhub-bench-running")
TARGET_MS = 20.0
# Active: reported within the last hour (the server's default window is 30 s; an hour keeps the same ~1% of runs
# active through the whole run, so every timed call sees the same numbers).
WINDOW = 3600
SERIES_WINDOW = 20_000  # the reference series' newest reports


class Reference:
    """The scan-based computation before running totals (server/metrics.py and contributions.by_user at
    revision 0007), kept as the baseline: every worker run and the whole ledger into Python, sorted there;
    the flags' peak rate as max() over every metric point of the experiment."""

    # the ledger's recount, unchanged since then (the tests use it as the recount the totals must equal)
    by_user = staticmethod(contributions.by_user)

    @staticmethod
    def leaderboard(
        session: Session, experiment: Experiment, window_seconds: int, *, with_flags: bool = False
    ) -> list[metrics.LeaderboardEntry]:
        since = utcnow() - timedelta(seconds=window_seconds)
        rows = session.execute(
            select(
                WorkerRun.user_id,
                User.username,
                WorkerRun.samples,
                WorkerRun.samples_per_second,
                WorkerRun.last_seen_at,
                WorkerRun.device,
            )
            .join(User, User.id == WorkerRun.user_id)
            .where(WorkerRun.experiment_id == experiment.id)
        ).all()
        per_user: dict[int, dict[str, Any]] = {}

        def entry_for(user_id: int, username: str) -> dict[str, Any]:
            return per_user.setdefault(
                user_id, {"username": username, "claimed": 0, "sps": 0.0, "last_seen": None, "classes": set()}
            )

        for user_id, username, samples, sps, last_seen, device in rows:
            entry = entry_for(user_id, username)
            if last_seen is None:
                continue
            # Running totals count the device classes of the runs that reported; so does this copy.
            entry["classes"].add(metrics.device_class(device))
            entry["claimed"] += samples
            if last_seen >= since:
                entry["sps"] += sps
            if entry["last_seen"] is None or last_seen > entry["last_seen"]:
                entry["last_seen"] = last_seen
        verified = Reference.by_user(session, experiment)
        if verified:
            # Was ``.where(User.id.in_(verified))``: one bind parameter per volunteer, over psycopg's 65,535 at
            # 100,000 volunteers (the scan-based code failed there); every name instead.
            names: dict[int, str] = dict(session.execute(select(User.id, User.username)).tuples().all())
            for user_id, v in verified.items():
                entry = entry_for(user_id, names[user_id])
                if v.last_seen is not None and (entry["last_seen"] is None or v.last_seen > entry["last_seen"]):
                    entry["last_seen"] = v.last_seen
        per_user = {uid: e for uid, e in per_user.items() if e["last_seen"] is not None}
        total_verified = sum(v.samples for v in verified.values())
        flags = Reference.flags(session, experiment, per_user, verified) if with_flags else {}
        ranked = sorted(
            per_user.items(),
            key=lambda item: (
                -verified.get(item[0], contributions.Verified()).samples,
                -item[1]["claimed"],
                item[1]["username"].lower(),
            ),
        )
        board = []
        for rank, (user_id, e) in enumerate(ranked, start=1):
            v = verified.get(user_id, contributions.Verified())
            board.append(
                metrics.LeaderboardEntry(
                    rank=rank,
                    username=e["username"],
                    samples=v.samples,
                    pending_samples=v.pending,
                    claimed_samples=e["claimed"],
                    share=round(v.samples / total_verified, 4) if total_verified else 0.0,
                    profile_url=volunteers.profile_path(e["username"]),  # no benchmark volunteer hides their profile
                    samples_per_second=round(e["sps"], 2),
                    time_online_seconds=round(v.online_seconds, 1),
                    active=e["last_seen"] >= since,
                    last_seen=e["last_seen"],
                    flags=flags.get(user_id, []) if with_flags else None,
                    # the benchmark's one experiment has no checkpoints
                    milestones=milestones.reached(v.samples, v.online_seconds, v.samples > 0, False),
                )
            )
        return board

    @staticmethod
    def flags(
        session: Session,
        experiment: Experiment,
        per_user: dict[int, dict[str, Any]],
        verified: dict[int, contributions.Verified],
    ) -> dict[int, list[str]]:
        peaks: dict[int, float] = dict(
            session.execute(
                select(WorkerRun.user_id, func.max(MetricPoint.samples_per_second))
                .join(MetricPoint, MetricPoint.worker_run_id == WorkerRun.id)
                .where(WorkerRun.experiment_id == experiment.id)
                .group_by(WorkerRun.user_id)
            )
            .tuples()
            .all()
        )
        fastest_signed: dict[str, float] = defaultdict(float)
        top_two: dict[str, list[tuple[float, int]]] = defaultdict(list)  # per class: the two fastest signers
        for user_id, e in per_user.items():
            signed = verified.get(user_id, contributions.Verified()).peak_samples_per_second
            for cls in e["classes"]:
                fastest_signed[cls] = max(fastest_signed[cls], signed)
                top_two[cls] = sorted([*top_two[cls], (signed, user_id)], reverse=True)[:2]

        def others(cls: str, user_id: int) -> float:  # the fastest signed rate of another peer of the class
            return next((peak for peak, holder in top_two[cls] if holder != user_id), 0.0)

        flags: dict[int, list[str]] = {}
        for user_id, e in per_user.items():
            v = verified.get(user_id, contributions.Verified())
            mine = []
            backed = v.samples + v.pending
            unseen = v.epochs * contributions.MONITOR_SECONDS * v.peak_samples_per_second
            if e["claimed"] > backed * (1 + metrics.CLAIM_SLACK) + unseen + 2 * experiment.target_batch_size:
                mine.append(
                    f"claims {e['claimed']:,} samples but the swarm's signed records show {backed:,}: "
                    "the rest never reached an averaging round"
                )
            peak = peaks.get(user_id) or 0.0
            for cls in sorted(e["classes"]):
                reference = fastest_signed[cls]
                if reference > 0 and peak > metrics.THROUGHPUT_FACTOR * reference:
                    mine.append(
                        f"reported {peak:,.0f} samples/s; "
                        f"the fastest signed rate of a {cls} peer here is {reference:,.0f}"
                    )
            classes = sorted(e["classes"])
            rivals = [others(cls, user_id) for cls in classes] if v.peak_samples_per_second > 0 else []
            if rivals and min(rivals) > 0 and v.peak_samples_per_second > metrics.SIGNED_FACTOR * max(rivals):
                mine.append(
                    f"signed records show {v.peak_samples_per_second:,.0f} samples/s; no other {'/'.join(classes)} "
                    f"peer here signed more than {max(rivals):,.0f}"
                )
            if mine:
                flags[user_id] = mine
        return flags

    @staticmethod
    def summary(session: Session, experiment: Experiment, window_seconds: int) -> metrics.Summary:
        since = utcnow() - timedelta(seconds=window_seconds)
        total, epoch = session.execute(
            select(func.coalesce(func.sum(WorkerRun.samples), 0), func.coalesce(func.max(WorkerRun.epoch), 0)).where(
                WorkerRun.experiment_id == experiment.id
            )
        ).one()
        active = session.execute(
            select(WorkerRun.samples_per_second, WorkerRun.loss).where(
                WorkerRun.experiment_id == experiment.id, WorkerRun.last_seen_at >= since
            )
        ).all()
        losses = [loss for _, loss in active if loss is not None]
        return metrics.Summary(
            status=experiment.status,
            active_peers=len(active),
            total_samples=int(total),
            verified_samples=sum(v.samples for v in Reference.by_user(session, experiment).values()),
            samples_per_second=round(sum(sps for sps, _ in active), 2),
            epoch=int(epoch),
            loss=round(sum(losses) / len(losses), 6) if losses else None,
            swarm_peers=None,
        )

    @staticmethod
    def series(session: Session, experiment: Experiment) -> list[metrics.SeriesPoint]:
        """The newest SERIES_WINDOW reports into Python, bucketed there: loss (mean over the reports), the sum of
        each worker's latest reported rate, reporting peers."""
        rows = list(
            session.execute(
                select(
                    MetricPoint.received_at, MetricPoint.worker_run_id, MetricPoint.loss, MetricPoint.samples_per_second
                )
                .where(MetricPoint.experiment_id == experiment.id)
                .order_by(MetricPoint.received_at.desc(), MetricPoint.id.desc())
                .limit(SERIES_WINDOW)
            ).all()
        )
        if not rows:
            return []
        rows.reverse()
        start, end = rows[0][0].timestamp(), rows[-1][0].timestamp()
        width = max(1.0, (end - start) / metrics.SERIES_POINTS)
        buckets: dict[int, dict[str, Any]] = defaultdict(lambda: {"losses": [], "sps": {}})
        for received_at, worker_id, loss, sps in rows:
            bucket = buckets[math.floor((received_at.timestamp() - start) / width)]
            bucket["losses"].append(loss)
            bucket["sps"][worker_id] = sps  # rows are in time order: the latest report per worker wins
        return [
            metrics.SeriesPoint(
                t=round(start + index * width, 3),
                loss=round(sum(b["losses"]) / len(b["losses"]), 6),
                samples_per_second=round(sum(b["sps"].values()), 2),
                peers=len(b["sps"]),
            )
            for index, b in sorted(buckets.items())
        ]

    @staticmethod
    def snapshot(session: Session, experiment: Experiment) -> dict[str, Any]:
        board = Reference.leaderboard(session, experiment, WINDOW)
        public = metrics.MetricsPublic(
            summary=Reference.summary(session, experiment, WINDOW), series=Reference.series(session, experiment)
        )
        return {
            "type": "snapshot",
            "metrics": public.model_dump(mode="json"),
            "leaderboard": [entry.model_dump(mode="json") for entry in board],
        }


# ---------------------------------------------------------------------------------------------------------------
# Building the database


def build(url: str, volunteers: int, points: int, epochs: int, log: Callable[[str], None]) -> dict[str, float]:
    """The bulk rows, written at revision 0007 with set-based SQL; then the upgrade to head (the backfill)."""
    timings = {}
    engine = make_engine(url)
    command.upgrade(alembic_config(engine), "0007")
    with engine.begin() as conn:
        # Through the tables as they are at 0007 (reflected), not the models: those may have gained columns since.
        tables = sa.MetaData()
        tables.reflect(conn, only=["users", "experiments"])
        users, experiment_table = tables.tables["users"], tables.tables["experiments"]
        password_hash = security.hash_password("correct-horse-battery")
        owner_id = conn.scalar(
            users.insert()
            .values(username="organizer", password_hash=password_hash, is_admin=True, created_at=utcnow())
            .returning(users.c.id)
        )
        fields = experiments.ExperimentCreate(slug="bench", title="Queries at scale", target_batch_size=4096)
        values = {
            **fields.model_dump(mode="json"),
            "owner_id": owner_id,
            "status": "running",
            "signing_key": swarm_tokens.new_signing_key_der(),
            "invite_code": "bench",
            "created_at": utcnow(),
            "updated_at": utcnow(),
        }
        experiment_id = conn.scalar(
            experiment_table.insert()
            .values({name: value for name, value in values.items() if name in experiment_table.c})
            .returning(experiment_table.c.id)
        )
    runs = volunteers + volunteers // 5  # one in five volunteers joined twice
    active = max(volunteers // 100, 10)  # of them, this many runs reported within the window
    params = {"v": volunteers, "r": runs, "n": points, "e": epochs, "x": experiment_id, "a": active}
    started = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(sa.text("SET session_replication_role = replica"))  # no per-row FK triggers while loading
        conn.execute(sa.text("SET maintenance_work_mem = '512MB'"))
        conn.execute(
            sa.text(
                "INSERT INTO users (username, password_hash, is_admin, created_at) "
                "SELECT 'Vol' || g, 'x', false, now() FROM generate_series(1, :v) g"
            ),
            params,
        )
        first_user = conn.scalar(sa.text("SELECT min(id) FROM users WHERE username LIKE 'Vol%'"))
        params["u"] = first_user
        # Run r belongs to volunteer r mod v; its last report is r minutes ago, except the newest ``a`` runs; its
        # latest count and seq are those of its newest metric point (below), as ingest would have left them.
        conn.execute(
            sa.text(
                "INSERT INTO worker_runs (id, experiment_id, user_id, device, created_at, last_seen_at, samples, "
                "epoch, loss, samples_per_second, last_seq) "
                "SELECT 'w' || lpad(r::text, 10, '0'), :x, :u + (r % :v), "
                "CASE WHEN r % 7 = 0 THEN 'cuda:0' WHEN r % 11 = 0 THEN 'mps' ELSE 'cpu' END, "
                "now() - interval '40 days', "
                "now() - CASE WHEN r < :a THEN interval '5 seconds' ELSE (r || ' minutes')::interval END, "
                "((:n - 1 - r) / :r) * 40, :e, 2.0 + (r % 100) / 100.0, 5 + (r % 50), (:n - 1 - r) / :r "
                "FROM generate_series(0, :r - 1) r"
            ),
            params,
        )
        conn.execute(sa.text("ALTER TABLE metric_points DROP CONSTRAINT uq_metric_points_worker_run_id"))
        conn.execute(sa.text("DROP INDEX ix_metric_points_experiment_time"))
        # Point g is report g / r of run g mod r, received in time order, newest last.
        conn.execute(
            sa.text(
                "INSERT INTO metric_points (experiment_id, worker_run_id, seq, received_at, step, epoch, samples, "
                "loss, samples_per_second, peers, averaged_peers) "
                "SELECT :x, 'w' || lpad((g % :r)::text, 10, '0'), g / :r, "
                "now() - ((:n - g) * interval '200 milliseconds'), g / :r, (g::bigint * :e) / :n, "
                "(g / :r) * 40, 2.0 + (g % 100) / 100.0, 5 + (g % 50), 20, 20 "
                "FROM generate_series(0, :n - 1) g"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "ALTER TABLE metric_points ADD CONSTRAINT uq_metric_points_worker_run_id UNIQUE (worker_run_id, seq)"
            )
        )  # noqa: E501
        conn.execute(
            sa.text("CREATE INDEX ix_metric_points_experiment_time ON metric_points (experiment_id, received_at)")
        )  # noqa: E501
        # The ledger: each volunteer's peer, and its samples in the epochs it took part in (about half).
        conn.execute(
            sa.text(
                "INSERT INTO swarm_peers (experiment_id, user_id, peer_id, first_seen, last_seen, online_seconds, "
                "record_time, peak_samples_per_second) "
                "SELECT :x, :u + v, 'Qm' || v, now() - interval '40 days', now() - (v || ' minutes')::interval, "
                "(hashint4(v) & 65535), extract(epoch FROM now()) - v * 60, 3 + (v % 40) "
                "FROM generate_series(0, :v - 1) v"
            ),
            params,
        )
        conn.execute(
            sa.text(
                "INSERT INTO peer_epochs (experiment_id, user_id, peer_id, epoch, samples) "
                "SELECT :x, :u + v, 'Qm' || v, e, (hashint4(v * 7919 + e) & 8191) "
                "FROM generate_series(0, :v - 1) v, generate_series(1, :e) e WHERE (v + e) % 2 = 0"
            ),
            params,
        )
    timings["load_s"] = time.perf_counter() - started
    log(f"loaded {volunteers:,} volunteers, {runs:,} runs, {points:,} points in {timings['load_s']:.0f} s")
    vacuum(engine)
    started = time.perf_counter()
    # The backfills sort and group every metric point: give them the memory a maintenance window would.
    upgrader = make_engine(url + "?options=-c%20work_mem%3D256MB")
    command.upgrade(alembic_config(upgrader), "head")
    upgrader.dispose()
    timings["backfill_s"] = time.perf_counter() - started
    log(f"upgraded to head (running totals and metric buckets backfilled) in {timings['backfill_s']:.0f} s")
    vacuum(engine)
    engine.dispose()
    return timings


def vacuum(engine: sa.Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE"))


# ---------------------------------------------------------------------------------------------------------------
# Driving a sample through the real functions, then checking the totals against a recount


def drive_sample(db: Any, experiment_id: int, log: Callable[[str], None]) -> None:
    """A few volunteers join, report (one message twice) and are read by the monitor while the swarm closes two
    epochs; one epoch gets a late, larger read after it closed."""
    with db.begin() as session:
        exp = session.get(Experiment, experiment_id)
        top = session.scalar(select(func.max(PeerEpoch.epoch)).where(PeerEpoch.experiment_id == experiment_id))
        users = [User(username=f"sample{i}", password_hash="x", is_admin=False) for i in range(20)]
        session.add_all(users)
        session.flush()
        runs = [
            experiments.start_worker_run(session, exp, u, "cuda:0" if i % 3 else "cpu") for i, u in enumerate(users)
        ]
        run_ids, names = [r.id for r in runs], [u.username for u in users]
        # An existing volunteer's run reports too: its claim replaces its previous latest count.
        old_run = session.scalar(select(WorkerRun.id).where(WorkerRun.last_seen_at.is_not(None)).limit(1))
    assert top is not None
    for step in range(3):
        for i, run_id in enumerate([*run_ids, old_run]):
            report = MetricReport(
                seq=10_000 + step, step=step, epoch=top, samples=100 * (step + 1) + i, loss=1.5,
                samples_per_second=30.0 + i, peers=20,
            )  # fmt: skip
            with db.begin() as session:
                assert metrics.ingest(session, session.get(WorkerRun, run_id), report)
        with db.begin() as session:  # a re-sent message
            assert not metrics.ingest(session, session.get(WorkerRun, run_ids[0]), report)
        now = utcnow()
        epoch = top + step  # the swarm moves on at each step: the previous epoch closes
        records = [
            contributions.Contribution(
                peer_id=f"QmS{i}", username=name, epoch=epoch, samples=50 + i, samples_per_second=25.0,
                time=now.timestamp(),
            )
            for i, name in enumerate(names)
        ]  # fmt: skip
        if step == 2:  # a late, larger read of the epoch closed one step ago
            records.append(records[0].model_copy(update={"epoch": epoch - 1, "samples": 4000}))
        with db.begin() as session:
            contributions.record(session, session.get(Experiment, experiment_id), records, now)
    log("sample driven through metrics.ingest and contributions.record")


RECOUNT = """
WITH open_epoch AS (SELECT max(epoch) AS e FROM peer_epochs WHERE experiment_id = :x),
claims AS (
  SELECT r.user_id, sum(r.samples) AS claimed, max(r.last_seen_at) AS last_report
  FROM worker_runs r WHERE r.experiment_id = :x AND r.last_seen_at IS NOT NULL GROUP BY r.user_id),
peaks AS (
  SELECT r.user_id, max(p.samples_per_second) AS peak
  FROM metric_points p JOIN worker_runs r ON r.id = p.worker_run_id WHERE r.experiment_id = :x GROUP BY r.user_id),
ledger AS (
  SELECT user_id, sum(samples) FILTER (WHERE epoch < (SELECT e FROM open_epoch)) AS verified,
         sum(samples) FILTER (WHERE epoch = (SELECT e FROM open_epoch)) AS pending, count(*) AS epochs
  FROM peer_epochs WHERE experiment_id = :x GROUP BY user_id),
signed AS (
  SELECT user_id, sum(online_seconds) AS online, max(last_seen) AS last_signed, max(peak_samples_per_second) AS peak
  FROM swarm_peers WHERE experiment_id = :x GROUP BY user_id),
people AS (SELECT user_id FROM claims UNION SELECT user_id FROM ledger UNION SELECT user_id FROM signed)
SELECT p.user_id, coalesce(c.claimed, 0), coalesce(k.peak, 0), c.last_report, coalesce(l.verified, 0),
       coalesce(l.pending, 0), coalesce(l.epochs, 0), round(coalesce(s.online, 0)::numeric, 3), s.last_signed,
       coalesce(s.peak, 0)
FROM people p LEFT JOIN claims c USING (user_id) LEFT JOIN peaks k USING (user_id) LEFT JOIN ledger l USING (user_id)
LEFT JOIN signed s USING (user_id)
"""
TOTALS = """
SELECT user_id, claimed_samples, peak_claimed_samples_per_second, last_report_at, verified_samples, pending_samples,
       epochs, round(online_seconds::numeric, 3), last_signed_at, peak_signed_samples_per_second
FROM volunteer_totals WHERE experiment_id = :x
"""


def check_totals(db: Any, experiment_id: int) -> str:
    """Every volunteer's running totals, and the experiment's, equal a recount from the stored rows; the pages
    and the summary equal the reference's."""
    with db() as session:
        params = {"x": experiment_id}
        recount = {tuple(row) for row in session.execute(sa.text(RECOUNT), params)}
        totals = {tuple(row) for row in session.execute(sa.text(TOTALS), params)}
        assert recount == totals, f"{len(recount ^ totals)} rows differ, e.g. {sorted(recount ^ totals)[:4]}"
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        board = Reference.leaderboard(session, exp, WINDOW, with_flags=True)
        for offset in (0, len(board) // 2):
            page = metrics.leaderboard(session, exp, WINDOW, with_flags=True, limit=100, offset=offset)
            assert page == board[offset : offset + 100], f"page at {offset} differs from the reference"
        assert metrics.summary(session, exp, WINDOW) == Reference.summary(session, exp, WINDOW)
    buckets = check_buckets(db, experiment_id)
    return f"{len(totals):,} volunteers' totals equal the recount; pages and summary equal the reference; {buckets}"


SERIES_SAMPLE = 3000  # seconds: the newest ten 5-minute buckets and their three hundred 10-second ones


def check_buckets(db: Any, experiment_id: int) -> str:
    """The metric buckets of the newest SERIES_SAMPLE seconds equal a recount from the stored reports (each run's
    reports there in arrival order, after its newest report before them), and the series shows them."""
    with db() as session:
        newest = session.scalar(
            select(func.max(MetricBucket.bucket_start)).where(
                MetricBucket.experiment_id == experiment_id, MetricBucket.width == metrics.BUCKET_WIDTHS[-1]
            )
        )
        since = newest - SERIES_SAMPLE + metrics.BUCKET_WIDTHS[-1]  # a 5-minute boundary
        params = {"x": experiment_id, "since": datetime.fromtimestamp(since, timezone.utc)}
        before = {
            run: (seq, samples)
            for run, seq, samples in session.execute(
                sa.text(
                    "SELECT r.worker_run_id, p.seq, p.samples FROM (SELECT DISTINCT worker_run_id FROM metric_points "
                    "WHERE experiment_id = :x AND received_at >= :since) r CROSS JOIN LATERAL (SELECT seq, samples "
                    "FROM metric_points p WHERE p.worker_run_id = r.worker_run_id AND p.received_at < :since "
                    "ORDER BY seq DESC LIMIT 1) p"
                ),
                params,
            )
        }
        reports = session.execute(
            select(
                MetricPoint.worker_run_id,
                MetricPoint.received_at,
                MetricPoint.seq,
                MetricPoint.samples,
                MetricPoint.loss,
            )
            .where(MetricPoint.experiment_id == experiment_id, MetricPoint.received_at >= params["since"])
            .order_by(MetricPoint.id)
        ).all()
        recount: dict[tuple[int, int], list[Any]] = {}
        runs: dict[tuple[int, int], set[str]] = defaultdict(set)
        for run, received_at, seq, samples, loss in reports:
            last_seq, last_samples = before.get(run, (-1, 0))
            added = samples - last_samples if seq > last_seq else 0
            if seq > last_seq:
                before[run] = (seq, samples)
            for width in metrics.BUCKET_WIDTHS:
                key = (width, math.floor(received_at.timestamp()) // width * width)
                b = recount.setdefault(key, [0.0, 0, 0])
                b[0] += loss
                b[1] += 1
                b[2] += added
                runs[key].add(run)
        stored = {
            (b.width, b.bucket_start): b
            for b in session.scalars(
                select(MetricBucket).where(
                    MetricBucket.experiment_id == experiment_id, MetricBucket.bucket_start >= since
                )
            )
        }
        assert set(stored) == set(recount), f"{len(set(stored) ^ set(recount))} buckets differ"
        for key, (loss_sum, count, added) in recount.items():
            b = stored[key]
            assert (b.reports, b.samples, b.peers) == (count, added, len(runs[key])), (key, b.__dict__)
            assert abs(b.loss_sum - loss_sum) <= 1e-6 * count, key
        exp = session.get(Experiment, experiment_id)
        assert exp is not None
        shown = {p.t: p for p in metrics.series(session, exp)}
        for (width, start), b in stored.items():
            if width == metrics.BUCKET_WIDTHS[-1]:  # the run spans days: the series shows the coarse buckets
                assert shown[float(start)].peers == b.peers
    return (
        f"{len(stored):,} metric buckets of the newest {SERIES_SAMPLE:,} s ({len(reports):,} reports) equal the recount"
    )


# ---------------------------------------------------------------------------------------------------------------
# Timing


def timed(db: Any, fn: Callable[[Session], Any], runs: int) -> list[float]:
    """Milliseconds per call, each in its own session (as a request has), after one warm-up call."""
    samples = []
    for i in range(runs + 1):
        with db() as session:
            started = time.perf_counter()
            fn(session)
            elapsed = (time.perf_counter() - started) * 1000
        if i:
            samples.append(elapsed)
    return samples


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def explain_series(db: Any, experiment_id: int) -> str:
    """The plan of the series' bucket read (the coarse resolution, as the bench's run spans days)."""
    with db() as session:
        newest = session.scalar(select(func.max(MetricBucket.bucket_start)))
        width = metrics.BUCKET_WIDTHS[-1]
        stmt = (
            select(MetricBucket)
            .where(
                MetricBucket.experiment_id == experiment_id,
                MetricBucket.width == width,
                MetricBucket.bucket_start > newest - metrics.SERIES_POINTS * width,
            )
            .order_by(MetricBucket.bucket_start)
        )
        sql = str(stmt.compile(session.get_bind(), compile_kwargs={"literal_binds": True}))
        plan = session.execute(sa.text("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)).scalars().all()
    return "\n".join(plan)


@contextmanager
def bench_lock(full: bool) -> Iterator[None]:
    if not full:
        yield
        return
    while LOCK.exists():
        print(f"waiting: {LOCK} exists (another benchmark runs)", flush=True)
        time.sleep(15)
    LOCK.write_text(f"bench/queries.py pid {os.getpid()}\n")
    try:
        yield
    finally:
        LOCK.unlink(missing_ok=True)


def machine() -> str:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB, {platform.platform()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 volunteers, 200,000 metric points")
    parser.add_argument("--server", default="postgresql+psycopg://postgres@127.0.0.1:5432", help="PostgreSQL URL")
    parser.add_argument("--database", default="swarmhub_bench_queries")
    parser.add_argument("--runs", type=int, default=0, help="timed calls per query (default 50, quick 20)")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument(
        "--reuse", action="store_true", help="time against the database a run with --keep left (no build; kept again)"
    )
    parser.add_argument("--only", default="", help="time only the queries whose name contains this text")
    parser.add_argument("--write", type=Path, default=None, help="write the results into this Markdown file")
    args = parser.parse_args()
    volunteers, points = (2_000, 200_000) if args.quick else (100_000, 10_000_000)
    epochs = 20
    runs = args.runs or (20 if args.quick else 50)
    reference_runs = max(3, runs // 10)
    url = f"{args.server}/{args.database}"

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)

    with bench_lock(not args.quick):
        admin = make_engine(f"{args.server}/postgres")
        if args.reuse:
            args.keep = True
            with admin.connect() as conn:
                found = conn.scalar(sa.text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": args.database})
            if not found:
                parser.error(f"--reuse: no database {args.database!r}; run once with --keep first")
        else:
            with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)'))
                conn.execute(sa.text(f'CREATE DATABASE "{args.database}"'))
        try:
            build_times = None if args.reuse else build(url, volunteers, points, epochs, log)
            engine = make_engine(url)
            db = make_sessionmaker(engine)
            with db() as session:
                exp = session.scalars(select(Experiment).where(Experiment.slug == "bench")).one()
                experiment_id = exp.id
            if not args.reuse:  # a kept build was driven by the run that built it
                drive_sample(db, experiment_id, log)
            checked = check_totals(db, experiment_id)
            log(checked)
            vacuum(engine)
            app = SimpleNamespace(
                state=SimpleNamespace(
                    settings=Settings(environment="test", database_url=url, active_window_seconds=WINDOW)
                )
            )
            with db() as session:
                exp = session.get(Experiment, experiment_id)
                assert exp is not None
                session.expunge(exp)
            with db() as session:
                board_size = len(Reference.leaderboard(session, session.merge(exp), WINDOW))
            deep = board_size // 2
            with db() as session:  # where a client paging by cursor stands before the deep page: rank `deep`
                handover = metrics.leaderboard_page(session, session.merge(exp), WINDOW, limit=1, offset=deep - 1)
                assert handover.next_cursor is not None
                after = metrics.Cursor.decode(handover.next_cursor)
                by_cursor = metrics.leaderboard_page(session, session.merge(exp), WINDOW, after=after).entries
                assert by_cursor == metrics.leaderboard(session, session.merge(exp), WINDOW, offset=deep)
                assert [entry.rank for entry in by_cursor] == list(range(deep + 1, deep + 101))

            def on(fn: Callable[[Session, Experiment], Any]) -> Callable[[Session], Any]:
                return lambda session: fn(session, session.merge(exp, load=False))

            cases: list[tuple[str, Callable[[Session], Any], Callable[[Session], Any]]] = [
                (
                    "leaderboard, first page (100)",
                    on(lambda s, e: metrics.leaderboard(s, e, WINDOW)),
                    on(lambda s, e: Reference.leaderboard(s, e, WINDOW)[:100]),
                ),
                (  # the deepest page the API serves by offset (deeper ones follow the cursor)
                    f"leaderboard, deepest offset page (offset {metrics.LEADERBOARD_MAX_OFFSET:,})",
                    on(lambda s, e: metrics.leaderboard(s, e, WINDOW, offset=metrics.LEADERBOARD_MAX_OFFSET)),
                    on(
                        lambda s, e: Reference.leaderboard(s, e, WINDOW)[
                            metrics.LEADERBOARD_MAX_OFFSET : metrics.LEADERBOARD_MAX_OFFSET + 100
                        ]
                    ),
                ),
                (  # past the API's window: what a page by offset costs this deep (the function has no window)
                    f"leaderboard, deep page (offset {deep:,}; the API answers 400 past 10,000)",
                    on(lambda s, e: metrics.leaderboard(s, e, WINDOW, offset=deep)),
                    on(lambda s, e: Reference.leaderboard(s, e, WINDOW)[deep : deep + 100]),
                ),
                (
                    f"leaderboard, deep page (cursor after rank {deep:,})",
                    on(lambda s, e: metrics.leaderboard_page(s, e, WINDOW, after=after)),
                    on(lambda s, e: Reference.leaderboard(s, e, WINDOW)[deep : deep + 100]),
                ),
                (
                    "leaderboard, organizer's (flags)",
                    on(lambda s, e: metrics.leaderboard(s, e, WINDOW, with_flags=True)),
                    on(lambda s, e: Reference.leaderboard(s, e, WINDOW, with_flags=True)[:100]),
                ),
                (
                    "summary",
                    on(lambda s, e: metrics.summary(s, e, WINDOW)),
                    on(lambda s, e: Reference.summary(s, e, WINDOW)),
                ),
                ("series", on(metrics.series), on(Reference.series)),
                (
                    "live snapshot",
                    on(lambda s, e: dashboard_snapshot(s, e, app)),  # type: ignore[arg-type]
                    on(Reference.snapshot),
                ),
            ]
            results = []
            for name, new, old in [case for case in cases if args.only in case[0]]:
                fast = timed(db, new, runs)
                slow = timed(db, old, reference_runs)
                results.append((name, fast, slow))
                log(f"{name}: {statistics.median(fast):.1f} ms (reference {statistics.median(slow):.0f} ms)")
            plan = explain_series(db, experiment_id)
            engine.dispose()
        finally:
            if not args.keep:
                with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{args.database}" WITH (FORCE)'))
            admin.dispose()

    header = "| query | median ms | p95 ms | reference median ms | speed-up | target <= 20 ms |"
    lines = [header, "| --- | ---: | ---: | ---: | ---: | --- |"]
    for name, fast, slow in results:
        med, tail, ref = statistics.median(fast), p95(fast), statistics.median(slow)
        verdict = "PASS" if max(med, tail) <= TARGET_MS else "MISS"
        lines.append(f"| {name} | {med:.1f} | {tail:.1f} | {ref:,.0f} | {ref / med:,.0f}x | {verdict} |")
    with make_engine(f"{args.server}/postgres").connect() as conn:
        server_version = conn.scalar(sa.text("SHOW server_version"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    report = "\n".join(
        [
            f"Measured {datetime.now().strftime('%Y-%m-%d %H:%M')}, commit {commit.stdout.strip() or '?'}; "
            f"{volunteers:,} volunteers ({board_size:,} on the board), {points:,} metric points, "
            f"{runs} timed calls per query ({reference_runs} for the reference), each in its own session.",
            f"Machine: {machine()}; PostgreSQL {server_version} on the same machine.",
            f"Command: `.venv/bin/python bench/queries.py{' --quick' if args.quick else ''}"
            f"{f' --only {args.only!r}' if args.only else ''}{' --reuse' if args.reuse else ''}`",
            (
                f"Build: bulk load {build_times['load_s']:.0f} s; upgrade to head with the running-totals and "
                f"metric-bucket backfills {build_times['backfill_s']:.0f} s. Check: {checked}."
                if build_times is not None
                else f"Build: the database a previous run kept (--reuse). Check: {checked}."
            ),
            "",
            *lines,
            "",
            "Series plan (`EXPLAIN ANALYZE`):",
            "",
            "```",
            plan,
            "```",
        ]
    )
    print()
    print(report)
    if args.write is not None:
        title = f"## Results: {'quick' if args.quick else 'full'} run"
        text = args.write.read_text() if args.write.exists() else ""
        if title in text:  # replace the previous results of the same size
            start = text.index(title)
            end = text.find("\n## ", start + len(title))
            text = text[:start] + text[end + 1 :] if end != -1 else text[:start]
        args.write.write_text(text.rstrip() + f"\n\n{title}\n\n{report}\n")


if __name__ == "__main__":
    main()
