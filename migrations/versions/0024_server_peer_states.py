"""swarm_leases keep the state of the holder's peer processes for the experiment (running or restarting, restarts,
last error), so that any server process can show the organizer what the hosting one supervises. Existing leases
keep NULL until their holder's next reconcile.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06 04:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("swarm_leases", sa.Column("server_peers", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("swarm_leases") as batch:
        batch.drop_column("server_peers")
