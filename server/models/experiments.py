"""Experiments, and who may take part in them: the volunteers invited in and those removed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from swarmhub.server.models.accounts import User
from swarmhub.server.models.base import Base, UTCDateTime, utcnow


class Experiment(Base):
    __tablename__ = "experiments"

    id: Mapped[int] = mapped_column(primary_key=True)
    slug: Mapped[str] = mapped_column(String(50), unique=True)
    title: Mapped[str] = mapped_column(String(120))
    description: Mapped[str] = mapped_column(Text, default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="draft")
    task: Mapped[str] = mapped_column(String(64))
    task_params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    optimizer: Mapped[str] = mapped_column(String(16))
    learning_rate: Mapped[float] = mapped_column(Float)
    target_batch_size: Mapped[int] = mapped_column(Integer)
    matchmaking_time: Mapped[float] = mapped_column(Float)
    averaging_timeout: Mapped[float] = mapped_column(Float)
    overlap: Mapped[str] = mapped_column(String(32), default="none")
    # Volunteers' peers per gradient averaging group (0: one group), and so how many witnesses the server runs
    group_size: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # How each reducer combines the peers' parts (``worker.robust``); the database's default only, as below
    aggregation: Mapped[str] = mapped_column(String(32), server_default=text("'mean'"))
    aux_peer: Mapped[bool] = mapped_column(Boolean, default=False)  # the server runs an auxiliary peer
    # How often the server's checkpoint peer saves the swarm's model (tasks that keep checkpoints)
    checkpoint_minutes: Mapped[float] = mapped_column(Float, default=10.0, server_default=text("10"))
    # How many peer keys one volunteer may hold valid swarm tokens for at once (``experiments.swarm_token``).
    # The database's default only: an insert that does not name it (rows written as of an older revision) works.
    max_peers_per_volunteer: Mapped[int] = mapped_column(Integer, server_default=text("4"))
    # Remove a volunteer once the server's peers flagged them this many times (0: never; the organizer decides)
    auto_remove_flags: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The kept checkpoint (its step) the organizer restored as the swarm's state, and how many restores were asked
    # for: the checkpoint peer acts on each new one once (``rollback.py``)
    restore_epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    restore_seq: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # The experiment's swarm token signing key (base64 DER). It never leaves the server.
    signing_key: Mapped[str] = mapped_column(Text)
    join_policy: Mapped[str] = mapped_column(String(16), default="open")  # open / invite / allowlist
    allowlist: Mapped[list[str]] = mapped_column(JSON, default=list)
    invite_code: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    owner: Mapped[User] = relationship(lazy="joined")


class ExperimentMember(Base):
    """A volunteer who accepted the experiment's invite link."""

    __tablename__ = "experiment_members"
    __table_args__ = (UniqueConstraint("experiment_id", "user_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class ExperimentBan(Base):
    """A volunteer the organizer removed: no more tokens, and every peer refuses them (the deny-list)."""

    __tablename__ = "experiment_bans"
    __table_args__ = (UniqueConstraint("experiment_id", "user_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    user: Mapped[User] = relationship(lazy="joined")
