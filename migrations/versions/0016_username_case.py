"""users: usernames unique case-insensitively in the database itself (a unique index on lower(username)), not only
in the code that signs users up: two processes signing up "Ada" and "ada" at once cannot both succeed

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    clashes = (
        op.get_bind()
        .execute(sa.text("SELECT lower(username) FROM users GROUP BY lower(username) HAVING count(*) > 1"))
        .scalars()
        .all()
    )
    if clashes:
        raise RuntimeError(
            "usernames that differ only in case: "
            + ", ".join(sorted(clashes)[:20])
            + ". Rename all but one of each (swarmhub admin cannot; use the database) and migrate again."
        )
    op.create_index("uq_users_username_lower", "users", [sa.text("lower(username)")], unique=True)


def downgrade() -> None:
    op.drop_index("uq_users_username_lower", table_name="users")
