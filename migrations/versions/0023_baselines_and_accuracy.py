"""corpora keep the unigram baseline of their held-out masked positions (cross-entropy, top-1 and top-5 accuracy),
and checkpoints their held-out accuracy (top-1, top-5) beside the loss. Existing rows keep NULL: nothing measured
them.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

CORPUS_COLUMNS = ("baseline_loss", "baseline_top1", "baseline_top5")
CHECKPOINT_COLUMNS = ("eval_top1", "eval_top5")


def upgrade() -> None:
    # Plain ADD COLUMNs (nullable, no default): no table copy on SQLite.
    for name in CORPUS_COLUMNS:
        op.add_column("corpora", sa.Column(name, sa.Float(), nullable=True))
    for name in CHECKPOINT_COLUMNS:
        op.add_column("checkpoints", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        for name in reversed(CHECKPOINT_COLUMNS):
            batch.drop_column(name)
    with op.batch_alter_table("corpora") as batch:
        for name in reversed(CORPUS_COLUMNS):
            batch.drop_column(name)
