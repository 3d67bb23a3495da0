"""experiments: communication overlap and the server's auxiliary peer

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 10:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("overlap", sa.String(length=32), nullable=False, server_default="none"))
        batch.add_column(sa.Column("aux_peer", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("aux_peer")
        batch.drop_column("overlap")
