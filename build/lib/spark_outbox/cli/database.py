"""Which database a command uses: ``DATABASE_URL``, else the private development cluster.

The fallback is the command line's decision (the library needs a URL): with
``DATABASE_URL`` unset, the demo, the tests and a first try on a laptop get a
PostgreSQL started from the machine's binaries under ``--state-dir``.
"""

from __future__ import annotations

import getpass

from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db
from spark_outbox.core.settings import Settings


def database_url(settings: Settings) -> str:
    """``DATABASE_URL`` when set; otherwise the private cluster's, started if need be."""
    if settings.database_url:
        return settings.database_url
    return PrivateCluster(settings.state_dir).ensure_running().url


def engine_for(settings: Settings) -> Engine:
    """A one-connection engine for a command that runs a few statements."""
    return db.create_engine(database_url(settings), pool_size=1)


def cli_actor() -> str:
    """Who did it, in ``operator_actions``: the login running the command."""
    return f"cli:{getpass.getuser()}"
