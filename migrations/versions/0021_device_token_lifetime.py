"""device_authorizations.token_days: the lifetime the approver chose for the device's token (NULL: until revoked).

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-02 09:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("device_authorizations") as batch:
        batch.add_column(sa.Column("token_days", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("device_authorizations") as batch:
        batch.drop_column("token_days")
