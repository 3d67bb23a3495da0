"""worker_runs get the peer a run trains as (peer_id, derived from the join's peer key) and how that peer takes part
as its worker reports it at the join (precision, client_mode, role, bandwidth_mbps), for the organizer's swarm
view. Existing runs keep NULL in each: their peer and figures were never recorded.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-02 12:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

COLUMNS = ("peer_id", "precision", "client_mode", "role", "bandwidth_mbps")


def upgrade() -> None:
    # Plain ADD COLUMNs (nullable, no default): no table copy on SQLite.
    op.add_column("worker_runs", sa.Column("peer_id", sa.String(length=64), nullable=True))
    op.add_column("worker_runs", sa.Column("precision", sa.String(length=8), nullable=True))
    op.add_column("worker_runs", sa.Column("client_mode", sa.Boolean(), nullable=True))
    op.add_column("worker_runs", sa.Column("role", sa.String(length=16), nullable=True))
    op.add_column("worker_runs", sa.Column("bandwidth_mbps", sa.Float(), nullable=True))
    op.create_index("ix_worker_runs_peer_id", "worker_runs", ["peer_id"])


def downgrade() -> None:
    op.drop_index("ix_worker_runs_peer_id", table_name="worker_runs")
    # worker_runs has no expression index, so SQLite's table copy in a batch loses nothing.
    with op.batch_alter_table("worker_runs") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
