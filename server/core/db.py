"""Engine, sessions and migrations. Alembic is the only way the schema changes."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.orm import sessionmaker


def make_engine(database_url: str) -> Engine:
    if database_url.startswith("postgresql://"):
        database_url = "postgresql+psycopg://" + database_url[len("postgresql://") :]
    if database_url.startswith("sqlite"):
        path = database_url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(database_url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.close()

        return engine
    return create_engine(database_url, pool_pre_ping=True)


def make_sessionmaker(engine: Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(files("swarmhub.migrations")))
    cfg.attributes["engine"] = engine
    return cfg


# pg_advisory_lock's key for migrations: any 64-bit number no other code of this database uses
MIGRATION_LOCK = 0x5357_4152_4D48_5542  # "SWARMHUB"


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest revision (run at start-up). On PostgreSQL several server processes
    starting at once take turns (a session-level advisory lock): the first migrates, the others find it done."""
    if engine.dialect.name != "postgresql":
        command.upgrade(alembic_config(engine), "head")  # SQLite: one machine, and its own file lock
        return
    with engine.connect() as lock:
        lock.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        lock.commit()
        try:
            command.upgrade(alembic_config(engine), "head")
        finally:
            lock.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            lock.commit()
