"""Which database a command uses: ``DATABASE_URL``, else the private development cluster.

The fallback is the command line's decision (the library needs a URL): with
``DATABASE_URL`` unset, the demo, the tests and a first try on a laptop get a
PostgreSQL started from the machine's binaries under ``--state-dir`` (one per
user by default, whatever the current directory). A command that falls back
says where on stderr, so ``$(outbox db url)`` still captures the URL alone.
"""

from __future__ import annotations

import getpass
import sys

from sqlalchemy.engine import Engine

from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db
from spark_outbox.core.settings import Settings


def database_url(settings: Settings) -> str:
    """``DATABASE_URL`` when set; otherwise the private cluster's, started if need be."""
    if settings.database_url:
        return settings.database_url
    cluster = PrivateCluster(settings.state_dir)
    info = cluster.ensure_running()
    print(
        f"outbox: private PostgreSQL on 127.0.0.1:{info.port}, state in {cluster.where} "
        "(DATABASE_URL unset; --state-dir or OUTBOX_STATE_DIR chooses another)",
        file=sys.stderr,
    )
    return info.url


def engine_for(settings: Settings) -> Engine:
    """A one-connection engine for a command that runs a few statements."""
    return db.create_engine(database_url(settings), pool_size=1)


def cli_actor() -> str:
    """Who did it, in ``operator_actions``: the login running the command."""
    return f"cli:{getpass.getuser()}"
