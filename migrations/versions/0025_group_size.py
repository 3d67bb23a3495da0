"""experiments: the volunteers' peers per gradient averaging group (0: one group of every peer)

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06 22:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("group_size", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("group_size")
