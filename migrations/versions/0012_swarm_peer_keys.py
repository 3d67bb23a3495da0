"""swarm_peer_keys: the peer keys each volunteer was issued swarm tokens for, and until when, so that one account
runs a bounded number of peers per experiment; experiments.max_peers_per_volunteer, that bound

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-05 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(
            sa.Column("max_peers_per_volunteer", sa.Integer(), server_default=sa.text("4"), nullable=False)
        )
    op.create_table(
        "swarm_peer_keys",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.Text(), nullable=False),
        sa.Column("first_issued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_swarm_peer_keys_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_swarm_peer_keys_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_swarm_peer_keys")),
        sa.UniqueConstraint("experiment_id", "peer_id", name=op.f("uq_swarm_peer_keys_experiment_id")),
    )
    op.create_index("ix_swarm_peer_keys_user_expiry", "swarm_peer_keys", ["user_id", "experiment_id", "expires_at"])


def downgrade() -> None:
    op.drop_index("ix_swarm_peer_keys_user_expiry", table_name="swarm_peer_keys")
    op.drop_table("swarm_peer_keys")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("max_peers_per_volunteer")
