"""The swarm as the server's peers see it: peer keys, volunteers' peers, witnessed rounds and their credit,
flags, per-epoch samples, and which server process hosts an experiment's peers."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from swarmhub.server.models.base import Base, UTCDateTime, utcnow


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
    (``worker/swarm/witness.py``): with its :class:`RoundCredit` rows, the ledger of verified work."""

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
    # The holder's peer processes for the run (``swarm.supervision.PeerState`` as JSON), as of its last reconcile.
    server_peers: Mapped[list[dict[str, object]] | None] = mapped_column(JSON, nullable=True)
