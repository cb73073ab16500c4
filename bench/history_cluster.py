"""The history bench's own PostgreSQL: a private cluster in ``.outbox-bench/``, sized
like a database server rather than a laptop's test cluster.

Its settings, and why (everything else is PostgreSQL's default, autovacuum included):
- ``shared_buffers=2GB``: a quarter of the RAM of a modest 8 GB database host, the
  usual starting point; the test cluster's 256MB would make every history larger
  than a few hundred MB look worse than any real deployment.
- ``effective_cache_size=6GB``: the rest of that host's page cache.
- ``maintenance_work_mem=512MB``: index builds and VACUUM of tables with millions
  of rows (one dead-tuple pass per VACUUM of the history, not several).
- ``max_wal_size=8GB``, ``checkpoint_timeout=15min``: bulk loads and purges of
  millions of rows without a checkpoint every few seconds (full-page writes).
- ``random_page_cost=1.1``: SSD storage.
- ``shared_preload_libraries=pg_stat_statements``, ``track_io_timing=on``: where the
  time goes, per statement (the bench's ``--explain`` and investigations).

With ``DATABASE_URL`` set, that server is used as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from spark_outbox.cli.tools import scratch
from spark_outbox.cli.tools.pgcluster import ADMIN_ROLE, PrivateCluster

STATE_DIR = Path(__file__).resolve().parents[1] / ".outbox-bench"

SERVER_SETTINGS = {
    "shared_buffers": "2GB",
    "effective_cache_size": "6GB",
    "maintenance_work_mem": "512MB",
    "max_wal_size": "8GB",
    "checkpoint_timeout": "15min",
    "random_page_cost": "1.1",
    "shared_preload_libraries": "pg_stat_statements",
    "track_io_timing": "on",
}


def cluster() -> PrivateCluster:
    return PrivateCluster(STATE_DIR, server_settings=SERVER_SETTINGS)


def server_url() -> str:
    """The server the bench's databases go on (started if need be)."""
    return os.environ.get("DATABASE_URL") or cluster().ensure_running().url


def admin_url(database: str) -> str | None:
    """The private cluster's superuser on ``database`` (extensions such as
    pg_stat_statements need one); None with ``DATABASE_URL``."""
    if os.environ.get("DATABASE_URL"):
        return None
    info = cluster().ensure_running()
    base = f"postgresql://{ADMIN_ROLE}:{info.admin_password}@127.0.0.1:{info.port}/postgres"
    return scratch.with_database(base, database)


def stop() -> None:
    cluster().stop()
