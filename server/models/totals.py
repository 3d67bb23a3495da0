"""Running totals kept in step with every report and signed record: per volunteer, per experiment, and per
time bucket of the dashboard's series."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, text
from sqlalchemy.orm import Mapped, mapped_column

from swarmhub.server.models.base import Base, UTCDateTime


class VolunteerTotal(Base):
    """One volunteer's running totals in one experiment, kept in step with every stored report
    (``metrics.ingest``) and every read of the swarm's progress records (``contributions.record``), so that the
    leaderboard is an index scan and not a scan of every report and signed record."""

    __tablename__ = "volunteer_totals"
    __table_args__ = (
        # The few rows with samples in the open epoch, which close when the swarm moves on.
        Index(
            "ix_volunteer_totals_pending",
            "experiment_id",
            postgresql_where=text("pending_samples > 0"),
            sqlite_where=text("pending_samples > 0"),
        ),
        # The fastest signed rates, read for the organizer's flags (metrics._ClassReferences)
        Index("ix_volunteer_totals_signed_peak", "experiment_id", "peak_signed_samples_per_second"),
    )

    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True)
    # lower(username) in code point order on every backend, the leaderboard's last tie-breaker
    sort_name: Mapped[str] = mapped_column(String(32).with_variant(String(32, collation="C"), "postgresql"))
    # What the volunteer's workers reported: the sum of each worker run's latest count.
    claimed_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    peak_claimed_samples_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    device_classes: Mapped[list[str]] = mapped_column(JSON, default=list)  # of the runs that reported
    last_report_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # What the swarm's signed records show (contributions.py): closed epochs, the open epoch, peer-epochs.
    verified_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    pending_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    epochs: Mapped[int] = mapped_column(BigInteger, default=0)
    online_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    last_signed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    peak_signed_samples_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    # times the server's peers flagged this volunteer's peers (SwarmFlag), for the organizer's view
    swarm_flags: Mapped[int] = mapped_column(Integer, server_default=text("0"))


class ExperimentTotal(Base):
    """An experiment's running totals beside its volunteers' (``VolunteerTotal``), for the summary."""

    __tablename__ = "experiment_totals"

    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    claimed_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    worker_epoch: Mapped[int] = mapped_column(BigInteger, default=0)  # the highest epoch a worker reported
    verified_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    pending_samples: Mapped[int] = mapped_column(BigInteger, default=0)
    max_epoch: Mapped[int | None] = mapped_column(BigInteger)  # the swarm's open epoch, as its signed records show
    # device class -> the fastest signed rate of a volunteer with a worker of that class (the flags' reference)
    signed_peaks: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)


# The leaderboard's order: an index scan that stops at the page.
Index(
    "ix_volunteer_totals_rank",
    VolunteerTotal.experiment_id,
    VolunteerTotal.verified_samples.desc(),
    VolunteerTotal.claimed_samples.desc(),
    VolunteerTotal.sort_name,
    VolunteerTotal.user_id,
)


class MetricBucket(Base):
    """The reports of one experiment in one time bucket of one resolution (``width`` seconds), kept in step with
    every stored report (``metrics.ingest``), so that the dashboard's series reads a few hundred rows and not the
    reports themselves. ``bucket_start`` is unix seconds (server clock), a multiple of ``width``."""

    __tablename__ = "metric_buckets"

    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    width: Mapped[int] = mapped_column(Integer, primary_key=True)
    bucket_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    loss_sum: Mapped[float] = mapped_column(Float, default=0.0)
    reports: Mapped[int] = mapped_column(BigInteger, default=0)  # stored reports, the loss's denominator
    # What the runs' sample counts grew by: each accepted report's count minus its run's previous one.
    samples: Mapped[int] = mapped_column(BigInteger, default=0)
    peers: Mapped[int] = mapped_column(Integer, default=0)  # worker runs with a stored report in the bucket
