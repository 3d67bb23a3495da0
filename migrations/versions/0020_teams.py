"""teams and team_members: volunteers add up their verified samples under a team's name, one team at a time each
(team_members.user_id is the primary key); team names are unique whatever the case, as usernames are.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-02 09:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "teams",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("description", sa.String(length=500), nullable=False),
        sa.Column("founder_id", sa.Integer(), nullable=True),
        sa.Column("creator_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["founder_id"], ["users.id"], name=op.f("fk_teams_founder_id_users"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["creator_id"], ["users.id"], name=op.f("fk_teams_creator_id_users"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_teams")),
        sa.UniqueConstraint("name", name=op.f("uq_teams_name")),
    )
    op.create_index(op.f("ix_teams_creator_id"), "teams", ["creator_id"])
    op.create_index("uq_teams_name_lower", "teams", [sa.text("lower(name)")], unique=True)
    op.create_table(
        "team_members",
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("team_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.Column("joined_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"], ["users.id"], name=op.f("fk_team_members_user_id_users"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["team_id"], ["teams.id"], name=op.f("fk_team_members_team_id_teams"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("user_id", name=op.f("pk_team_members")),
    )
    op.create_index(op.f("ix_team_members_team_id"), "team_members", ["team_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_team_members_team_id"), table_name="team_members")
    op.drop_table("team_members")
    op.drop_index("uq_teams_name_lower", table_name="teams")
    op.drop_index(op.f("ix_teams_creator_id"), table_name="teams")
    op.drop_table("teams")
