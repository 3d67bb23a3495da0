"""Three server processes starting at once on one empty PostgreSQL database: they take turns migrating (an
advisory lock), so all three start and the schema is migrated once."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import sqlalchemy as sa

from swarmhub.server.core.db import make_engine

from .conftest import POSTGRES_URL, _drop_postgres, _prepare_postgres

pytestmark = pytest.mark.both_databases  # the migration lock is a database lock

MIGRATE_AT = """
import sys, time
from swarmhub.server.core.db import make_engine, migrate
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time()))  # all three at the same moment
migrate(make_engine(sys.argv[1]))
print("migrated")
"""


def test_three_processes_starting_together_migrate_once():
    url = _prepare_postgres(POSTGRES_URL.rsplit("/", 1)[0] + "/swarmhub_migration_race")  # a new, empty database
    start = time.time() + 4.0  # after every interpreter has imported swarmhub
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE_AT, url, str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=180)[0] for p in processes]
    for process, output in zip(processes, outputs, strict=True):
        assert process.returncode == 0 and output.strip().endswith("migrated"), output[-3000:]
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars().all()
            tables = set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()
        _drop_postgres(url)
    assert len(versions) == 1 and {"users", "experiments", "swarm_leases"} <= tables, (versions, tables)
