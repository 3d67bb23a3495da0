"""Database tables (SQLAlchemy 2). Change them only together with a migration in ``migrations/``."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Timezone-aware UTC datetimes on every backend (SQLite stores naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(timezone.utc) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class User(Base):
    __tablename__ = "users"
    # unique whatever the case, in the database itself (migration 0016)
    __table_args__ = (Index("uq_users_username_lower", func.lower(text("username")), unique=True),)

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(32), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WebSession(Base):
    """A browser login. Only the SHA-256 of the cookie value is stored; logout deletes the row."""

    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(lazy="joined")


class ApiToken(Base):
    """A CLI bearer token. Only its SHA-256 is stored; the value is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(12))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    user: Mapped[User] = relationship(lazy="joined")


class DeviceAuthorization(Base):
    """RFC 8628 device authorization grant in progress."""

    __tablename__ = "device_authorizations"

    id: Mapped[int] = mapped_column(primary_key=True)
    device_code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    user_code: Mapped[str] = mapped_column(String(9), unique=True)
    client_name: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending/approved/denied/consumed
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    interval: Mapped[int] = mapped_column(Integer, default=5)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_polled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    user: Mapped[User | None] = relationship(lazy="joined")


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


class SwarmPeerKey(Base):
    """A peer key the server issued a volunteer's swarm tokens for, in one experiment: whose it is and until when
    its newest token is valid. A key belongs to the first volunteer it was issued to; the keys with a valid token
    are the volunteer's running peers, which ``Experiment.max_peers_per_volunteer`` bounds."""

    __tablename__ = "swarm_peer_keys"
    __table_args__ = (
        UniqueConstraint("experiment_id", "peer_id"),
        # A volunteer's keys with a valid token, counted before each new key is admitted
        Index("ix_swarm_peer_keys_user_expiry", "user_id", "experiment_id", "expires_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    peer_id: Mapped[str] = mapped_column(String(64))  # libp2p's peer ID of the key, as hivemind derives it
    public_key: Mapped[str] = mapped_column(Text)  # OpenSSH text, as the token binds it
    first_issued_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)  # the expiry of the newest token issued for it


class SwarmPeer(Base):
    """A volunteer's peer as the experiment's monitor sees it in the swarm: its signed progress records,
    attributed through the access token whose key signed them."""

    __tablename__ = "swarm_peers"
    __table_args__ = (UniqueConstraint("experiment_id", "peer_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    peer_id: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    online_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    record_time: Mapped[float] = mapped_column(Float, default=0.0)  # the newest record's own timestamp
    peak_samples_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    last_round_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its newest witnessed round


class WitnessedRound(Base):
    """A gradient averaging round that the server's auxiliary peer took part in and saw complete
    (``worker/witness.py``): with its :class:`RoundCredit` rows, the ledger of verified work."""

    __tablename__ = "witnessed_rounds"
    __table_args__ = (
        UniqueConstraint("experiment_id", "round_id"),
        # the rounds of the last minutes, which bound each sender's credit (witnessed.record_rounds)
        Index("ix_witnessed_rounds_time", "experiment_id", "witnessed_at"),
    )

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    round_id: Mapped[str] = mapped_column(String(64))  # hivemind's group ID, hex
    epoch: Mapped[int] = mapped_column(BigInteger)  # the witness's epoch when the round ran
    witnessed_at: Mapped[datetime] = mapped_column(UTCDateTime)  # the witness's clock at the round's end


class RoundCredit(Base):
    """One sender of a witnessed round: the weight it counted for in the average (as the server's reducer capped
    it) and the samples credited for it (``contributions.record_rounds``)."""

    __tablename__ = "round_credits"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    round_pk: Mapped[int] = mapped_column(ForeignKey("witnessed_rounds.id", ondelete="CASCADE"), index=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    peer_id: Mapped[str] = mapped_column(String(64))
    weight: Mapped[float] = mapped_column(Float)
    credited: Mapped[int] = mapped_column(BigInteger)


class SwarmFlag(Base):
    """Something the server's own peer refused from a volunteer's peer (non-finite gradients, an epoch ahead of the
    swarm, a poisoned state), as its witness record reported it."""

    __tablename__ = "swarm_flags"
    __table_args__ = (UniqueConstraint("experiment_id", "event_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    peer_id: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(200))
    event_id: Mapped[str] = mapped_column(String(64))
    count: Mapped[int] = mapped_column(Integer)
    flagged_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class PeerEpoch(Base):
    """The samples one peer's signed records showed for one swarm epoch (the largest count seen)."""

    __tablename__ = "peer_epochs"
    __table_args__ = (UniqueConstraint("experiment_id", "peer_id", "epoch"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    peer_id: Mapped[str] = mapped_column(String(64))
    epoch: Mapped[int] = mapped_column(BigInteger)
    samples: Mapped[int] = mapped_column(BigInteger, default=0)


class SwarmLease(Base):
    """Which server process hosts an experiment's swarm peers: exactly one at a time, renewed while it lives."""

    __tablename__ = "swarm_leases"

    run_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    holder: Mapped[str] = mapped_column(String(64))
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    maddrs: Mapped[list[str]] = mapped_column(JSON, default=list)  # the bootstrap addresses, once it listens
    peers: Mapped[int | None] = mapped_column(Integer, nullable=True)  # what its monitor saw last


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


class Corpus(Base):
    """An experiment's training text, prepared by the server (``corpus.prepare``): a tokenizer and token shards in
    ``data_dir/corpora/<folder>``, served to its workers. ``next_shard`` hands the shards out in turn."""

    __tablename__ = "corpora"

    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True)
    folder: Mapped[str] = mapped_column(String(100))
    source: Mapped[str] = mapped_column(String(300))  # "upload:NAME", "builtin:NAME" or "server:NAME"
    bytes: Mapped[int] = mapped_column(BigInteger)
    text_sha256: Mapped[str] = mapped_column(String(64))
    vocab_size: Mapped[int] = mapped_column(Integer)
    seq_length: Mapped[int] = mapped_column(Integer)
    shards: Mapped[int] = mapped_column(Integer)
    train_sequences: Mapped[int] = mapped_column(BigInteger)
    eval_sequences: Mapped[int] = mapped_column(Integer)
    next_shard: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Checkpoint(Base):
    """A model the server's checkpoint peer pulled from the swarm at one collaborative step, with its held-out
    loss; the files (for download and for resuming an emptied swarm) are in ``data_dir/checkpoints/<folder>``."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("experiment_id", "epoch"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"))
    epoch: Mapped[int] = mapped_column(BigInteger)
    eval_loss: Mapped[float | None] = mapped_column(Float)
    folder: Mapped[str] = mapped_column(String(200))
    kept: Mapped[bool] = mapped_column(Boolean, default=True)  # False once its files were pruned
    restored_from: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # a rollback's first checkpoint
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
