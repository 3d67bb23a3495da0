"""users get profile_hidden: a volunteer may hide their public page (/u/{username}) and its JSON. Every existing
profile stays visible.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.add_column(sa.Column("profile_hidden", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("profile_hidden")
