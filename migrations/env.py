"""Alembic environment: the engine comes from the caller (``swarmhub.server.db.migrate``)."""

from alembic import context
from sqlalchemy import create_engine

from swarmhub.server.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # plain `alembic` command line: take the URL from the ini / -x
    engine = create_engine(config.get_main_option("sqlalchemy.url"))

with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
