"""who may join: open, invite link or allow-list

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 08:25:00
"""

import secrets

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("join_policy", sa.String(length=16), nullable=False, server_default="open"))
        batch.add_column(sa.Column("allowlist", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("invite_code", sa.String(length=64), nullable=True))
    experiments = sa.table(
        "experiments", sa.column("id", sa.Integer), sa.column("invite_code", sa.String), sa.column("allowlist", sa.JSON)
    )
    conn = op.get_bind()
    for (experiment_id,) in conn.execute(sa.select(experiments.c.id)).all():
        conn.execute(
            experiments.update()
            .where(experiments.c.id == experiment_id)
            .values(invite_code=secrets.token_urlsafe(16), allowlist=[])
        )
    with op.batch_alter_table("experiments") as batch:
        batch.alter_column("join_policy", existing_type=sa.String(length=16), server_default=None)
        batch.alter_column("allowlist", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("invite_code", existing_type=sa.String(length=64), nullable=False)
    op.create_table(
        "experiment_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_experiment_members_experiment_id_experiments"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_experiment_members_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiment_members")),
        sa.UniqueConstraint("experiment_id", "user_id", name=op.f("uq_experiment_members_experiment_id")),
    )


def downgrade() -> None:
    op.drop_table("experiment_members")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("invite_code")
        batch.drop_column("allowlist")
        batch.drop_column("join_policy")
