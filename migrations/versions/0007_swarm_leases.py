"""swarm leases: which server process hosts each running experiment's swarm peers

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30 10:35:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "swarm_leases",
        sa.Column("run_id", sa.String(length=200), nullable=False),
        sa.Column("holder", sa.String(length=64), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("maddrs", sa.JSON(), nullable=False),
        sa.Column("peers", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name="pk_swarm_leases"),
    )


def downgrade() -> None:
    op.drop_table("swarm_leases")
