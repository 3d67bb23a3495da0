"""witnessed_rounds and round_credits: the gradient rounds the server's auxiliary peer saw complete and who sent
what weight in them (the ledger of verified work); swarm_flags: what the server's peers refused from volunteers'
peers; swarm_peers.last_round_at; volunteer_totals.swarm_flags; experiment_totals.witnessed_peaks;
experiments.auto_remove_flags

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06 12:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _fk(table: str, column: str, target: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(
        [column], [f"{target}.id"], name=op.f(f"fk_{table}_{column}_{target}"), ondelete="CASCADE"
    )


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("auto_remove_flags", sa.Integer(), server_default=sa.text("0"), nullable=False))
    with op.batch_alter_table("swarm_peers") as batch:
        batch.add_column(sa.Column("last_round_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("volunteer_totals") as batch:
        batch.add_column(sa.Column("swarm_flags", sa.Integer(), server_default=sa.text("0"), nullable=False))
    with op.batch_alter_table("experiment_totals") as batch:
        batch.add_column(sa.Column("witnessed_peaks", sa.JSON(), server_default=sa.text("'{}'"), nullable=False))
    op.create_table(
        "witnessed_rounds",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("round_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("witnessed_at", sa.DateTime(timezone=True), nullable=False),
        _fk("witnessed_rounds", "experiment_id", "experiments"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_witnessed_rounds")),
        sa.UniqueConstraint("experiment_id", "round_id", name=op.f("uq_witnessed_rounds_experiment_id")),
    )
    op.create_table(
        "round_credits",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("round_pk", BIG_ID, nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("credited", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["round_pk"],
            ["witnessed_rounds.id"],
            name=op.f("fk_round_credits_round_pk_witnessed_rounds"),
            ondelete="CASCADE",
        ),  # fmt: skip
        _fk("round_credits", "experiment_id", "experiments"),
        _fk("round_credits", "user_id", "users"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_round_credits")),
    )
    op.create_index("ix_round_credits_round_pk", "round_credits", ["round_pk"])
    op.create_index("ix_round_credits_user_id", "round_credits", ["user_id"])
    op.create_table(
        "swarm_flags",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("user_id", sa.Integer(), nullable=False),
        sa.Column("peer_id", sa.String(length=64), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=False),
        sa.Column("event_id", sa.String(length=64), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("flagged_at", sa.DateTime(timezone=True), nullable=False),
        _fk("swarm_flags", "experiment_id", "experiments"),
        _fk("swarm_flags", "user_id", "users"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_swarm_flags")),
        sa.UniqueConstraint("experiment_id", "event_id", name=op.f("uq_swarm_flags_experiment_id")),
    )
    op.create_index("ix_swarm_flags_user_id", "swarm_flags", ["user_id"])


def downgrade() -> None:
    op.drop_index("ix_swarm_flags_user_id", table_name="swarm_flags")
    op.drop_table("swarm_flags")
    op.drop_index("ix_round_credits_user_id", table_name="round_credits")
    op.drop_index("ix_round_credits_round_pk", table_name="round_credits")
    op.drop_table("round_credits")
    op.drop_table("witnessed_rounds")
    with op.batch_alter_table("experiment_totals") as batch:
        batch.drop_column("witnessed_peaks")
    with op.batch_alter_table("volunteer_totals") as batch:
        batch.drop_column("swarm_flags")
    with op.batch_alter_table("swarm_peers") as batch:
        batch.drop_column("last_round_at")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("auto_remove_flags")
