"""corpora and checkpoints: the training text the server prepares and serves, and the models its checkpoint
peer keeps

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("checkpoint_minutes", sa.Float(), server_default=sa.text("10"), nullable=False))
    op.create_table(
        "corpora",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("folder", sa.String(length=100), nullable=False),
        sa.Column("source", sa.String(length=300), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("text_sha256", sa.String(length=64), nullable=False),
        sa.Column("vocab_size", sa.Integer(), nullable=False),
        sa.Column("seq_length", sa.Integer(), nullable=False),
        sa.Column("shards", sa.Integer(), nullable=False),
        sa.Column("train_sequences", sa.BigInteger(), nullable=False),
        sa.Column("eval_sequences", sa.Integer(), nullable=False),
        sa.Column("next_shard", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_corpora_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", name=op.f("pk_corpora")),
    )
    op.create_table(
        "checkpoints",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("eval_loss", sa.Float(), nullable=True),
        sa.Column("folder", sa.String(length=200), nullable=False),
        sa.Column("kept", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_checkpoints_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_checkpoints")),
        sa.UniqueConstraint("experiment_id", "epoch", name=op.f("uq_checkpoints_experiment_id")),
    )


def downgrade() -> None:
    op.drop_table("checkpoints")
    op.drop_table("corpora")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("checkpoint_minutes")
