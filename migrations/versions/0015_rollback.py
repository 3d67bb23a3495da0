"""experiments.restore_epoch and restore_seq: the kept checkpoint an organizer restored as the swarm's state, and
how many restores were asked for (the checkpoint peer acts on each new one once); checkpoints.restored_from: the
step whose checkpoint a checkpoint's state was restored from

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 21:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("restore_epoch", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("restore_seq", sa.Integer(), server_default=sa.text("0"), nullable=False))
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("restored_from", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("restored_from")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("restore_seq")
        batch.drop_column("restore_epoch")
