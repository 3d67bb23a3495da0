"""Migrations are the only way the schema changes: after upgrading, the models and the database agree."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from swarmhub.server.db import make_engine
from swarmhub.server.models import Base


def test_migrations_match_models(database_url):
    engine = make_engine(database_url)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []
