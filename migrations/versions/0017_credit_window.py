"""witnessed rounds: an index on (experiment_id, witnessed_at), for the credit bound that holds each sender's credit
over the last minutes against the other volunteers' over the same minutes; experiment_totals.witnessed_peaks (the
per-second rate bound it replaces) dropped

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-02 00:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_witnessed_rounds_time", "witnessed_rounds", ["experiment_id", "witnessed_at"])
    # resolve_fks=False: the batch copies this table only; following its foreign keys would reflect users too, whose
    # expression index (uq_users_username_lower) SQLite's reflection cannot read and warns about.
    with op.batch_alter_table("experiment_totals", reflect_kwargs={"resolve_fks": False}) as batch:
        batch.drop_column("witnessed_peaks")


def downgrade() -> None:
    with op.batch_alter_table("experiment_totals", reflect_kwargs={"resolve_fks": False}) as batch:
        batch.add_column(sa.Column("witnessed_peaks", sa.JSON(), server_default=sa.text("'{}'"), nullable=False))
    op.drop_index("ix_witnessed_rounds_time", table_name="witnessed_rounds")
