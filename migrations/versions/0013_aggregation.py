"""experiments.aggregation: how each reducer combines the peers' parts of an averaging round (mean or
centered-clip); existing experiments keep the mean

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("aggregation", sa.String(length=32), server_default="mean", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("aggregation")
