"""team_foundings: every team an account founded, kept when the team is deleted (the creation quota counts them)

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "team_foundings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("creator_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["creator_id"], ["users.id"], name=op.f("fk_team_foundings_creator_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_team_foundings")),
    )
    op.create_index(op.f("ix_team_foundings_creator_id"), "team_foundings", ["creator_id"])
    # the teams that still exist were founded too
    op.execute(
        "INSERT INTO team_foundings (creator_id, created_at) "
        "SELECT creator_id, created_at FROM teams WHERE creator_id IS NOT NULL"
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_team_foundings_creator_id"), table_name="team_foundings")
    op.drop_table("team_foundings")
