"""verified contributions: peers seen in the swarm and their signed samples per epoch

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 09:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "swarm_peers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=True), nullable=False),
        sa.Column("online_seconds", sa.Float(), nullable=False),
        sa.Column("record_time", sa.Float(), nullable=False),
        sa.Column("peak_samples_per_second", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name="fk_swarm_peers_experiment_id_experiments", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_swarm_peers_user_id_users", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_swarm_peers"),
        sa.UniqueConstraint("experiment_id", "peer_id", name="uq_swarm_peers_experiment_id"),
    )
    op.create_index("ix_swarm_peers_user_id", "swarm_peers", ["user_id"])
    op.create_table(
        "peer_epochs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name="fk_peer_epochs_experiment_id_experiments", ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["user_id"], ["users.id"], name="fk_peer_epochs_user_id_users", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_peer_epochs"),
        sa.UniqueConstraint("experiment_id", "peer_id", "epoch", name="uq_peer_epochs_experiment_id"),
    )
    op.create_index("ix_peer_epochs_user_id", "peer_epochs", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_peer_epochs_user_id", table_name="peer_epochs")
    op.drop_table("peer_epochs")
    op.drop_index("ix_swarm_peers_user_id", table_name="swarm_peers")
    op.drop_table("swarm_peers")
