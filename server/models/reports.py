"""What volunteers' workers report: one row per worker run, one per stored metric message."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from swarmhub.server.models.accounts import User
from swarmhub.server.models.base import Base, UTCDateTime, utcnow


class WorkerRun(Base):
    """One `swarmhub join` of one volunteer: the unit that reports metrics and earns samples."""

    __tablename__ = "worker_runs"
    __table_args__ = (Index("ix_worker_runs_experiment_seen", "experiment_id", "last_seen_at"),)  # active runs

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    device: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_stored_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its newest stored report's arrival
    samples: Mapped[int] = mapped_column(BigInteger, default=0)
    epoch: Mapped[int] = mapped_column(BigInteger, default=0)
    loss: Mapped[float | None] = mapped_column(Float)
    samples_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    last_seq: Mapped[int] = mapped_column(BigInteger, default=-1)  # the highest seq stored (see metrics.ingest)
    # Its peer, as the join's peer key derives it (NULL: a run started before 0022), and how that peer takes part
    # as the worker reported it at the join (NULL: not reported, as by a worker older than these fields).
    peer_id: Mapped[str | None] = mapped_column(String(64), index=True)
    precision: Mapped[str | None] = mapped_column(String(8))
    client_mode: Mapped[bool | None] = mapped_column(Boolean)
    role: Mapped[str | None] = mapped_column(String(16))
    bandwidth_mbps: Mapped[float | None] = mapped_column(Float)

    user: Mapped[User] = relationship(lazy="joined")


class MetricPoint(Base):
    """One stored metric message; (worker_run_id, seq) makes a re-sent message a no-op."""

    __tablename__ = "metric_points"
    __table_args__ = (
        UniqueConstraint("worker_run_id", "seq"),
        Index("ix_metric_points_experiment_time", "experiment_id", "received_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    worker_run_id: Mapped[str] = mapped_column(ForeignKey("worker_runs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(BigInteger)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    step: Mapped[int] = mapped_column(BigInteger)
    epoch: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int] = mapped_column(BigInteger)
    loss: Mapped[float] = mapped_column(Float)
    samples_per_second: Mapped[float] = mapped_column(Float)
    peers: Mapped[int] = mapped_column(Integer)
    averaged_peers: Mapped[int] = mapped_column(Integer)
