"""Alembic environment: the engine comes from the caller (``swarmhub.server.core.db.migrate``)."""

from alembic import context
from sqlalchemy import create_engine

from swarmhub.server.models import Base

config = context.config
engine = config.attributes.get("engine")
if engine is None:  # plain `alembic` command line: take the URL from the ini / -x
    engine = create_engine(config.get_main_option("sqlalchemy.url"))

with engine.connect() as connection:
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # Batch mode changes a table by copying it, dropping the old one and renaming the copy: with foreign keys
        # on, that drop would cascade to every row that refers to the table. SQLite's own recipe for schema
        # changes: keys off (outside a transaction, where the pragma takes effect), then checked before commit.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=sqlite,
        compare_type=True,
    )
    try:
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"the migration left rows whose foreign keys point nowhere: {broken[:5]}")
        connection.commit()
    finally:
        if sqlite:
            connection.rollback()
            connection.exec_driver_sql("PRAGMA foreign_keys=ON")
