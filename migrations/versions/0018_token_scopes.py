"""api tokens and device grants get a scope: a volunteer token joins, reports and reads; an organizer token also
creates and runs experiments. Tokens issued before scopes keep the rights they had (organizer). Tokens may expire,
and keep the client address of their last use; the device grant keeps the address of the client that asked for it,
for the approval page.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("scope", sa.String(16), server_default="organizer", nullable=False))
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("last_used_address", sa.String(64), nullable=True))
    with op.batch_alter_table("device_authorizations") as batch:
        batch.add_column(sa.Column("scope", sa.String(16), server_default="volunteer", nullable=False))
        batch.add_column(sa.Column("client_address", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("device_authorizations") as batch:
        batch.drop_column("client_address")
        batch.drop_column("scope")
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("last_used_address")
        batch.drop_column("expires_at")
        batch.drop_column("scope")
