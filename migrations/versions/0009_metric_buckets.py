"""metric buckets: the dashboard's series, kept per time bucket as reports arrive

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

WIDTHS = (10, 300)  # as swarmhub.server.metrics.BUCKET_WIDTHS

# Buckets from the stored reports, with the definitions metrics.ingest keeps them by. In each run's arrival
# order (id), a report is accepted when its seq is above every earlier one's; an accepted report adds its
# samples minus the previous accepted report's (the first: all of them), a late one adds none. Peers: the
# runs with a report in the bucket. ``{t}`` is the report's unix second.
BACKFILL = """
INSERT INTO metric_buckets (experiment_id, width, bucket_start, loss_sum, reports, samples, peers)
WITH ordered AS (
    SELECT id, experiment_id, worker_run_id, seq, samples, loss, {t} AS t,
           max(seq) OVER (PARTITION BY worker_run_id ORDER BY id
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS seen
    FROM metric_points
), deltas AS (
    SELECT id, samples - coalesce(lag(samples) OVER (PARTITION BY worker_run_id ORDER BY id), 0) AS added
    FROM ordered WHERE seen IS NULL OR seq > seen
), per_run AS (
    SELECT o.experiment_id, w.width, (o.t / w.width) * w.width AS bucket_start,
           sum(o.loss) AS loss_sum, count(*) AS reports, sum(coalesce(d.added, 0)) AS samples
    FROM ordered o LEFT JOIN deltas d ON d.id = o.id
    CROSS JOIN ({widths}) w
    GROUP BY o.experiment_id, w.width, (o.t / w.width) * w.width, o.worker_run_id
)
SELECT experiment_id, width, bucket_start, sum(loss_sum), sum(reports), sum(samples), count(*)
FROM per_run GROUP BY experiment_id, width, bucket_start
"""


def upgrade() -> None:
    op.create_table(
        "metric_buckets",
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("width", sa.Integer(), nullable=False),
        sa.Column("bucket_start", sa.BigInteger(), nullable=False),
        sa.Column("loss_sum", sa.Float(), nullable=False),
        sa.Column("reports", sa.BigInteger(), nullable=False),
        sa.Column("samples", sa.BigInteger(), nullable=False),
        sa.Column("peers", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name="fk_metric_buckets_experiment_id_experiments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("experiment_id", "width", "bucket_start", name="pk_metric_buckets"),
    )
    op.execute(sa.text(backfill_sql(op.get_bind().dialect.name)))


def backfill_sql(dialect: str) -> str:
    if dialect == "postgresql":
        t = "floor(extract(epoch FROM received_at))::bigint"
    else:  # SQLite stores UTC as text
        t = "CAST(strftime('%s', received_at) AS INTEGER)"
    return BACKFILL.format(t=t, widths=" UNION ALL ".join(f"SELECT {w} AS width" for w in WIDTHS))


def downgrade() -> None:
    op.drop_table("metric_buckets")
