"""Database administration on a server: create and drop whole databases.

The demo gives every run a fresh database (its report counts everything in
it) and ``--crash`` a second one for the clean reference run. Identifiers are
quoted by psycopg2, never formatted in by hand.
"""

from __future__ import annotations

import psycopg2
from psycopg2 import sql
from sqlalchemy.engine import make_url

from dispatcher import db
from dispatcher.errors import DatabaseUnavailable


def with_database(url: str, name: str) -> str:
    """The same server URL, pointing at database ``name``."""
    return make_url(db.sqlalchemy_url(url)).set(database=name).render_as_string(hide_password=False)


def database_name(url: str) -> str:
    return str(make_url(db.sqlalchemy_url(url)).database)


def _admin_execute(server_url: str, statement: sql.Composable) -> None:
    try:
        conn = psycopg2.connect(db.libpq_url(with_database(server_url, "postgres")))
    except psycopg2.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach {db.redact(server_url)}: {exc}") from exc
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(statement)
    except psycopg2.Error as exc:
        raise DatabaseUnavailable(
            f"{statement.as_string(conn)} failed on {db.redact(server_url)}: {exc}; "
            "the role needs CREATEDB"
        ) from exc
    finally:
        conn.close()


def recreate_database(server_url: str, name: str) -> str:
    """Drop ``name`` if it exists (closing its sessions), create it empty; return its URL."""
    drop_database(server_url, name)
    _admin_execute(server_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    _admin_execute(
        server_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    )
