"""experiment signing keys for swarm access tokens

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 08:00:00
"""

import base64

import sqlalchemy as sa
from alembic import op
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def _new_key() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.private_bytes(
        serialization.Encoding.DER, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    return base64.b64encode(der).decode()


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("signing_key", sa.Text(), nullable=True))
    experiments = sa.table("experiments", sa.column("id", sa.Integer), sa.column("signing_key", sa.Text))
    conn = op.get_bind()
    for (experiment_id,) in conn.execute(sa.select(experiments.c.id)).all():
        conn.execute(experiments.update().where(experiments.c.id == experiment_id).values(signing_key=_new_key()))
    with op.batch_alter_table("experiments") as batch:
        batch.alter_column("signing_key", existing_type=sa.Text(), nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("signing_key")
