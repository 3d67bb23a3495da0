"""running totals: per volunteer and per experiment, kept as reports and signed records arrive

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 09:00:00
"""

from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

worker_runs = sa.table(
    "worker_runs",
    sa.column("id"),
    sa.column("experiment_id"),
    sa.column("user_id"),
    sa.column("device"),
    sa.column("samples"),
    sa.column("epoch"),
    sa.column("last_seen_at", sa.DateTime(timezone=True)),
)
metric_points = sa.table("metric_points", sa.column("worker_run_id"), sa.column("samples_per_second"))
peer_epochs = sa.table(
    "peer_epochs", sa.column("experiment_id"), sa.column("user_id"), sa.column("epoch"), sa.column("samples")
)
swarm_peers = sa.table(
    "swarm_peers",
    sa.column("experiment_id"),
    sa.column("user_id"),
    sa.column("online_seconds"),
    sa.column("last_seen", sa.DateTime(timezone=True)),
    sa.column("peak_samples_per_second"),
)
users = sa.table("users", sa.column("id"), sa.column("username"))


def upgrade() -> None:
    sort_name = sa.String(length=32).with_variant(sa.String(length=32, collation="C"), "postgresql")
    volunteer_totals = op.create_table(
        "volunteer_totals",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("sort_name", sort_name, nullable=False),
        sa.Column("claimed_samples", sa.BigInteger(), nullable=False),
        sa.Column("peak_claimed_samples_per_second", sa.Float(), nullable=False),
        sa.Column("device_classes", sa.JSON(), nullable=False),
        sa.Column("last_report_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("verified_samples", sa.BigInteger(), nullable=False),
        sa.Column("pending_samples", sa.BigInteger(), nullable=False),
        sa.Column("epochs", sa.BigInteger(), nullable=False),
        sa.Column("online_seconds", sa.Float(), nullable=False),
        sa.Column("last_signed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("peak_signed_samples_per_second", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name="fk_volunteer_totals_experiment_id_experiments",
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name="fk_volunteer_totals_user_id_users", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("experiment_id", "user_id", name="pk_volunteer_totals"),
    )
    experiment_totals = op.create_table(
        "experiment_totals",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("claimed_samples", sa.BigInteger(), nullable=False),
        sa.Column("worker_epoch", sa.BigInteger(), nullable=False),
        sa.Column("verified_samples", sa.BigInteger(), nullable=False),
        sa.Column("pending_samples", sa.BigInteger(), nullable=False),
        sa.Column("max_epoch", sa.BigInteger(), nullable=True),
        sa.Column("signed_peaks", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name="fk_experiment_totals_experiment_id_experiments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name="pk_experiment_totals"),
    )
    _backfill(volunteer_totals, experiment_totals)
    op.create_index("ix_volunteer_totals_user_id", "volunteer_totals", ["user_id"])
    op.create_index(
        "ix_volunteer_totals_rank",
        "volunteer_totals",
        ["experiment_id", sa.text("verified_samples DESC"), sa.text("claimed_samples DESC"), "sort_name", "user_id"],
    )
    op.create_index(
        "ix_volunteer_totals_pending",
        "volunteer_totals",
        ["experiment_id"],
        postgresql_where=sa.text("pending_samples > 0"),
        sqlite_where=sa.text("pending_samples > 0"),
    )
    op.create_index("ix_worker_runs_experiment_seen", "worker_runs", ["experiment_id", "last_seen_at"])


def _device_class(device: str) -> str:  # as swarmhub.server.metrics.device_class
    return device.split(":", 1)[0].lower() or "cpu"


def _backfill(volunteer_totals: sa.Table, experiment_totals: sa.Table) -> None:
    """Totals from the rows already stored, as the leaderboard counted them before (one pass per table)."""
    bind = op.get_bind()
    people: dict[tuple[int, int], dict[str, Any]] = {}

    def person(experiment_id: int, user_id: int) -> dict[str, Any]:
        return people.setdefault(
            (experiment_id, user_id),
            {
                "experiment_id": experiment_id,
                "user_id": user_id,
                "claimed_samples": 0,
                "peak_claimed_samples_per_second": 0.0,
                "device_classes": set(),
                "last_report_at": None,
                "verified_samples": 0,
                "pending_samples": 0,
                "epochs": 0,
                "online_seconds": 0.0,
                "last_signed_at": None,
                "peak_signed_samples_per_second": 0.0,
            },
        )

    experiments: dict[int, dict[str, Any]] = defaultdict(
        lambda: {"claimed_samples": 0, "worker_epoch": 0, "verified_samples": 0, "pending_samples": 0}
    )
    runs = bind.execute(
        sa.select(
            worker_runs.c.experiment_id,
            worker_runs.c.user_id,
            worker_runs.c.device,
            worker_runs.c.samples,
            worker_runs.c.epoch,
            worker_runs.c.last_seen_at,
        ).where(worker_runs.c.last_seen_at.is_not(None))
    )
    for experiment_id, user_id, device, samples, epoch, last_seen in runs:
        p = person(experiment_id, user_id)
        p["claimed_samples"] += samples
        p["device_classes"].add(_device_class(device))
        p["last_report_at"] = last_seen if p["last_report_at"] is None else max(p["last_report_at"], last_seen)
        e = experiments[experiment_id]
        e["claimed_samples"] += samples
        e["worker_epoch"] = max(e["worker_epoch"], epoch)
    peaks = bind.execute(
        sa.select(worker_runs.c.experiment_id, worker_runs.c.user_id, sa.func.max(metric_points.c.samples_per_second))
        .join(metric_points, metric_points.c.worker_run_id == worker_runs.c.id)
        .group_by(worker_runs.c.experiment_id, worker_runs.c.user_id)
    )
    for experiment_id, user_id, peak in peaks:
        if (experiment_id, user_id) in people:
            people[experiment_id, user_id]["peak_claimed_samples_per_second"] = float(peak)
    open_epochs = dict(
        bind.execute(
            sa.select(peer_epochs.c.experiment_id, sa.func.max(peer_epochs.c.epoch)).group_by(
                peer_epochs.c.experiment_id
            )
        )
        .tuples()
        .all()
    )
    ledger = bind.execute(
        sa.select(
            peer_epochs.c.experiment_id,
            peer_epochs.c.user_id,
            peer_epochs.c.epoch,
            sa.func.sum(peer_epochs.c.samples),
            sa.func.count(),
        ).group_by(peer_epochs.c.experiment_id, peer_epochs.c.user_id, peer_epochs.c.epoch)
    )
    for experiment_id, user_id, epoch, samples, count in ledger:
        p, e = person(experiment_id, user_id), experiments[experiment_id]
        key = "verified_samples" if epoch < open_epochs[experiment_id] else "pending_samples"
        p[key] += int(samples)
        e[key] += int(samples)
        p["epochs"] += int(count)
    peers = bind.execute(
        sa.select(
            swarm_peers.c.experiment_id,
            swarm_peers.c.user_id,
            sa.func.sum(swarm_peers.c.online_seconds),
            sa.func.max(swarm_peers.c.last_seen),
            sa.func.max(swarm_peers.c.peak_samples_per_second),
        ).group_by(swarm_peers.c.experiment_id, swarm_peers.c.user_id)
    )
    for experiment_id, user_id, online, last_seen, peak in peers:
        p = person(experiment_id, user_id)
        p["online_seconds"], p["last_signed_at"], p["peak_signed_samples_per_second"] = float(online), last_seen, peak
        experiments[experiment_id]  # noqa: B018 - every experiment with a ledger gets a totals row
    names = dict(bind.execute(sa.select(users.c.id, users.c.username)).tuples().all())
    signed_peaks: dict[int, dict[str, float]] = defaultdict(dict)
    rows = []
    for p in people.values():
        classes = sorted(p["device_classes"])
        by_class = signed_peaks[p["experiment_id"]]
        for cls in classes:
            by_class[cls] = max(by_class.get(cls, 0.0), float(p["peak_signed_samples_per_second"]))
        rows.append({**p, "device_classes": classes, "sort_name": names[p["user_id"]].lower()})
    for start in range(0, len(rows), 10_000):
        bind.execute(volunteer_totals.insert(), rows[start : start + 10_000])
    if experiments:
        bind.execute(
            experiment_totals.insert(),
            [
                {
                    "experiment_id": experiment_id,
                    **e,
                    "max_epoch": open_epochs.get(experiment_id),
                    "signed_peaks": signed_peaks[experiment_id],
                }
                for experiment_id, e in experiments.items()
            ],
        )


def downgrade() -> None:
    op.drop_index("ix_worker_runs_experiment_seen", table_name="worker_runs")
    op.drop_index("ix_volunteer_totals_pending", table_name="volunteer_totals")
    op.drop_index("ix_volunteer_totals_rank", table_name="volunteer_totals")
    op.drop_index("ix_volunteer_totals_user_id", table_name="volunteer_totals")
    op.drop_table("experiment_totals")
    op.drop_table("volunteer_totals")
