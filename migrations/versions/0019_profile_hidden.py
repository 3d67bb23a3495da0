"""users get profile_hidden: a volunteer may hide their public page (/u/{username}) and its JSON. Every existing
profile stays visible.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-02 08:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


# A plain ADD COLUMN, never a batch: on SQLite a batch copies the table, and the copy loses the expression index
# that keeps usernames unique whatever their case (uq_users_username_lower, 0016), which SQLite cannot reflect.


def upgrade() -> None:
    op.add_column("users", sa.Column("profile_hidden", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("users") as batch:
        batch.drop_column("profile_hidden")
    if op.get_bind().dialect.name == "sqlite":  # the copy lost it (see above)
        op.create_index("uq_users_username_lower", "users", [sa.text("lower(username)")], unique=True)
