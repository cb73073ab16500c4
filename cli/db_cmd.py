"""``outbox db``: the private PostgreSQL cluster and the schema."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from spark_outbox.cli.database import database_url
from spark_outbox.cli.tools.pgcluster import PrivateCluster
from spark_outbox.core import db, revisions
from spark_outbox.core.errors import ConfigurationError
from spark_outbox.core.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("db", help="start/stop the private PostgreSQL, migrate the schema")
    cmds = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    cmds.add_parser("start", help="start (or reuse) the private cluster").set_defaults(
        handler=start
    )
    cmds.add_parser("stop", help="stop the private cluster").set_defaults(handler=stop)
    cmds.add_parser("status", help="is the private cluster running?").set_defaults(handler=status)
    url_p = cmds.add_parser(
        "url",
        help="print the database URL for psql, DATABASE_URL and spark_outbox.core.db.create_engine "
        "(starts the private cluster if need be)",
    )
    url_p.add_argument(
        "--sqlalchemy",
        action="store_true",
        help="print it with the driver for plain sqlalchemy.create_engine "
        "(postgresql+psycopg2://...)",
    )
    url_p.set_defaults(handler=url)
    up = cmds.add_parser("upgrade", help="migrate the outbox schema")
    up.add_argument(
        "revision",
        nargs="?",
        default=db.OUTBOX_HEAD,
        help="Alembic target: outbox@head, billing@head (the example's table) or heads "
        "(default: %(default)s)",
    )
    up.add_argument(
        "--lock-timeout-s",
        type=float,
        default=5.0,
        help="each statement waits at most this long for a lock, so the traffic queued "
        "behind it never waits longer; 0 waits as long as it takes (default: %(default)s)",
    )
    up.add_argument(
        "--tries",
        type=int,
        default=20,
        help="tries when a lock wait runs out or a deadlock rolls the upgrade back; each "
        "resumes from the last committed revision (default: %(default)s)",
    )
    up.set_defaults(handler=upgrade)
    down = cmds.add_parser("downgrade", help="migrate the schema down to REVISION")
    down.add_argument("revision", help="Alembic target, e.g. outbox@-1 or 0004")
    down.set_defaults(handler=downgrade)
    cmds.add_parser("current", help="print the schema revision").set_defaults(handler=current)
    sql = cmds.add_parser(
        "sql",
        help="print the schema's SQL (every migration, offline: tables, views, the "
        "append-only trigger), without connecting",
    )
    sql.set_defaults(handler=print_sql)


def start(args: argparse.Namespace, settings: Settings) -> int:
    if settings.database_url:
        print(
            f"DATABASE_URL is set ({db.redact(settings.database_url)}): no private cluster needed"
        )
        return 0
    info = PrivateCluster(settings.state_dir).ensure_running()
    print(f"PostgreSQL running on 127.0.0.1:{info.port}, data in {info.data_dir}")
    return 0


def stop(args: argparse.Namespace, settings: Settings) -> int:
    cluster = PrivateCluster(settings.state_dir)
    stopped = cluster.stop()
    print(f"stopped: {cluster.where}" if stopped else f"not running: {cluster.where}")
    return 0


def status(args: argparse.Namespace, settings: Settings) -> int:
    if settings.database_url:
        print(f"using DATABASE_URL: {db.redact(settings.database_url)}")
        return 0
    cluster = PrivateCluster(settings.state_dir)
    running, info = cluster.status()
    if info is None:
        print(f"no private cluster under {cluster.where}")
        _mention_old_default(cluster)
        return 3
    print(f"{'running' if running else 'stopped'}: 127.0.0.1:{info.port}, data in {info.data_dir}")
    return 0 if running else 3


def _mention_old_default(searched: PrivateCluster) -> None:
    """The default state directory was ``.outbox`` under the current directory
    before: a cluster started then may still be there (as root: where that path
    was relocated to)."""
    former = PrivateCluster(Path(".outbox"))
    if former.state_dir != searched.state_dir and (former.state_dir / "cluster.json").is_file():
        print(
            f"outbox: a private cluster is also under {former.state_dir}, from the former "
            "default (.outbox here): `outbox --state-dir .outbox db status` shows it, "
            "`outbox --state-dir .outbox db stop` stops it",
            file=sys.stderr,
        )


def url(args: argparse.Namespace, settings: Settings) -> int:
    """libpq's form by default (``postgresql://``: psql, psycopg2, and everything of
    this project); SQLAlchemy 2.1 reads that scheme as psycopg 3, which is not
    installed, so ``--sqlalchemy`` names the driver."""
    found = database_url(settings)
    print(db.sqlalchemy_url(found) if args.sqlalchemy else db.libpq_url(found))
    return 0


def upgrade(args: argparse.Namespace, settings: Settings) -> int:
    if args.lock_timeout_s < 0 or args.tries < 1:
        raise ConfigurationError("--lock-timeout-s must be >= 0 and --tries >= 1")
    db.upgrade(
        database_url(settings),
        args.revision,
        lock_timeout_s=args.lock_timeout_s or None,
        tries=args.tries,
    )
    print(f"schema at {args.revision}")
    return 0


def downgrade(args: argparse.Namespace, settings: Settings) -> int:
    db.downgrade(database_url(settings), args.revision)
    print(f"schema at {args.revision}")
    return 0


def current(args: argparse.Namespace, settings: Settings) -> int:
    engine = db.create_engine(database_url(settings), pool_size=1)
    try:
        print(revisions.read(engine).current or "(empty)")
    finally:
        engine.dispose()
    return 0


def print_sql(args: argparse.Namespace, settings: Settings) -> int:
    """The outbox schema as SQL, without connecting: every migration of the
    ``outbox`` branch in offline mode, so the views and the append-only trigger
    are there too, and ``alembic_version`` lets ``outbox db upgrade`` carry on
    from it later."""
    from alembic import command

    command.upgrade(
        db.alembic_config("postgresql://offline@localhost/outbox"), db.OUTBOX_HEAD, sql=True
    )
    return 0
