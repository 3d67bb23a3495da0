"""worker_runs.last_stored_at: when the run's newest stored report was received, so that a batch of reports
knows whether a run already counts as a peer in a metric bucket without looking through its reports; an index
on the volunteers' fastest signed rates, for the organizer's flags

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-04 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("worker_runs") as batch:
        batch.add_column(sa.Column("last_stored_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE worker_runs SET last_stored_at = "
        "(SELECT max(received_at) FROM metric_points WHERE metric_points.worker_run_id = worker_runs.id)"
    )
    op.create_index(
        "ix_volunteer_totals_signed_peak", "volunteer_totals", ["experiment_id", "peak_signed_samples_per_second"]
    )


def downgrade() -> None:
    op.drop_index("ix_volunteer_totals_signed_peak", table_name="volunteer_totals")
    with op.batch_alter_table("worker_runs") as batch:
        batch.drop_column("last_stored_at")
