"""An experiment's training data and models: its prepared corpus and the checkpoints taken from its swarm."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from swarmhub.server.models.base import Base, UTCDateTime, utcnow


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
    # The unigram baseline on the held-out masked positions (the task's ``baseline``), computed when the text is
    # prepared; NULL for a corpus prepared before it was kept.
    baseline_loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline_top1: Mapped[float | None] = mapped_column(Float, nullable=True)
    baseline_top5: Mapped[float | None] = mapped_column(Float, nullable=True)
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
    eval_top1: Mapped[float | None] = mapped_column(Float, nullable=True)  # held-out accuracy: the label ranked first
    eval_top5: Mapped[float | None] = mapped_column(Float, nullable=True)  # ... among the five most likely
    folder: Mapped[str] = mapped_column(String(200))
    kept: Mapped[bool] = mapped_column(Boolean, default=True)  # False once its files were pruned
    restored_from: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # a rollback's first checkpoint
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
