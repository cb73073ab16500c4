"""Connecting: the engine, and bringing the schema to head (which revision the
database holds, and refusing an older one: spark_outbox.core.revisions).

Which database is the caller's decision: ``Settings.database_url`` must be set
(the CLI falls back to a private development cluster; nothing here does).
The migrations have two branches: ``outbox`` (the outbox schema, what a
deployment needs) and ``billing`` (the example job's table).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from collections.abc import Iterator, Mapping

import psycopg2
import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy.engine import Engine, make_url

from spark_outbox.core import outside, pgterse
from spark_outbox.core.errors import ConfigurationError, DatabaseUnavailable, UpgradeBlocked

log = logging.getLogger(__name__)

# Alembic targets: the outbox schema, the example's table, or both.
OUTBOX_HEAD = "outbox@head"
BILLING_HEAD = "billing@head"
ALL_HEADS = "heads"


def require_url(url: str) -> str:
    if not url:
        raise ConfigurationError(
            "no database: set DATABASE_URL (or run through the `outbox` command, which "
            "starts a private development cluster when it is unset)"
        )
    return url


URL_EXAMPLE = "postgresql://USER@HOST:5432/DATABASE"


def check_url(url: str, setting: str = "DATABASE_URL") -> str:
    """``url`` if it is a PostgreSQL URL this project can connect with, else a
    ``ConfigurationError`` naming ``setting`` and the fix (a garbage, MySQL or SQLite URL
    once ended in the driver's traceback at the first connection). The URL is shown
    only with its password masked."""
    shown = redact(url)
    if url.startswith("jdbc:"):
        raise ConfigurationError(
            f"{setting} is a JDBC URL; drop the jdbc: prefix, e.g. {URL_EXAMPLE}"
        )
    try:
        parsed = make_url(sqlalchemy_url(url))
        port = parsed.port
    except (ValueError, sa.exc.ArgumentError):
        raise ConfigurationError(
            f"{setting} ({shown}) is not a database URL; write it as {URL_EXAMPLE} (several "
            "hosts: ?host=h1:5432&host=h2:5432)"
        ) from None
    if parsed.drivername != "postgresql+psycopg2":
        raise ConfigurationError(
            f"{setting} names {parsed.drivername!r}; spark-outbox runs on PostgreSQL: "
            f"write it as {URL_EXAMPLE}"
        )
    if port is not None and not 1 <= port <= 65_535:
        raise ConfigurationError(f"{setting} has port {port}; use a port from 1 to 65535")
    if outside.has_space_or_control(parsed.host or ""):
        raise ConfigurationError(
            f"{setting} has spaces or control characters in its host; remove them"
        )
    return url


def sqlalchemy_url(url: str) -> str:
    """Accept plain ``postgresql://`` / ``postgres://`` URLs; pin the psycopg2 driver."""
    parsed = make_url(url.replace("postgres://", "postgresql://", 1))
    if parsed.drivername in ("postgresql", "postgresql+psycopg2"):
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same URL without SQLAlchemy's driver suffix, for psycopg2 and JDBC builders."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def create_engine(
    url: str,
    *,
    pool_size: int = 5,
    application_name: str = "spark-outbox",
    pre_ping: bool = True,
    autocommit: bool = False,
    session_settings: Mapping[str, str] | None = None,
) -> Engine:
    """A pooled engine. ``pre_ping=False`` for callers that retry every call on a
    lost connection (the dispatcher's DbCalls): the ping is one more round trip
    per checkout, measured at ~6 % of a dispatcher's samples under load.
    ``autocommit`` for callers whose every call is one statement (the
    dispatcher's store: one round trip, no BEGIN/COMMIT); ``session_settings``
    are PostgreSQL settings for every connection (``SET name = value``)."""
    connect_args = {"application_name": application_name}
    if session_settings:
        connect_args["options"] = " ".join(f"-c {k}={v}" for k, v in session_settings.items())
    engine = sa.create_engine(
        sqlalchemy_url(url),
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        # Errors never carry bound parameters: endpoint rows hold secrets.
        hide_parameters=True,
        connect_args=connect_args,
        isolation_level="AUTOCOMMIT" if autocommit else "READ COMMITTED",
    )
    return terse_errors(engine)


def terse_errors(engine: Engine) -> Engine:
    """Every connection of ``engine`` gets terse error messages (``pgterse``): with
    ``hide_parameters=True``, no error text carries a bound value. Every engine the
    project creates goes through here."""
    sa.event.listen(engine, "connect", lambda conn, _record: pgterse.make_terse(conn))
    return engine


def connection_lost(exc: BaseException) -> bool:
    """True when ``exc`` means "the database is (briefly) unreachable", not "the SQL
    is wrong": a refused or dropped connection, a server shutting down or starting
    up, a connection the pool invalidated. The one definition for the dispatcher,
    the sink and the API."""
    if isinstance(exc, sa.exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        exc = exc.orig if exc.orig is not None else exc
        if isinstance(exc, sa.exc.OperationalError | sa.exc.InterfaceError):
            return True
    return isinstance(exc, psycopg2.OperationalError | psycopg2.InterfaceError)


# PostgreSQL's answers when a statement gave up waiting for a lock (lock_timeout) or
# was chosen to break a deadlock: a migration that met either can simply run again.
_LOCK_WAITS = {
    "55P03": "waited longer than the lock timeout for a lock",
    "40P01": "deadlocked with the traffic and was rolled back",
}

# PgBouncer's answer to a startup packet carrying ``options``.
_STARTUP_OPTIONS_REFUSED = "unsupported startup parameter"


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Driver errors that mean "unreachable" leave as ``DatabaseUnavailable``.

    The one place the driver's errors become the project's own; any other
    driver error (a bug, a constraint) passes through unchanged.
    """
    try:
        yield
    except (sa.exc.DBAPIError, psycopg2.Error) as exc:
        if not connection_lost(exc):
            raise
        cause = exc.orig if isinstance(exc, sa.exc.DBAPIError) else exc
        first_line = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        if _STARTUP_OPTIONS_REFUSED in first_line:
            # Not an outage: a pooler that refuses startup options refuses every
            # connection the same way, so retrying would wait forever.
            raise ConfigurationError(
                f"the database (or a pooler in front of it) refuses connection options "
                f"({first_line.split('FATAL:')[-1].strip()}): behind PgBouncer set "
                "OUTBOX_STARTUP_OPTIONS=0 and put the dispatcher's settings on its role "
                '(docs/operations.md, "Connections, and PgBouncer")'
            ) from None
        raise DatabaseUnavailable(
            f"the database is unavailable ({type(cause).__name__}: {first_line})"
        ) from exc


def redact(url: str) -> str:
    """The URL with its password masked, for logs, messages and reprs: the one in the
    user part and a ``?password=`` (libpq reads both). Never raises: a URL that does
    not parse is hidden whole, since its password could be anywhere in it."""
    try:
        parsed = make_url(sqlalchemy_url(url))
    except (ValueError, sa.exc.ArgumentError):
        return "<a database URL that does not parse>"
    if "password" in parsed.query:
        parsed = parsed.update_query_dict({"password": "***"})
    return parsed.render_as_string(hide_password=True)


def alembic_config(url: str) -> Config:
    cfg = Config()
    # The scripts as a package resource: the ground floor finds them without importing
    # the migrations (which stand on it).
    cfg.set_main_option("script_location", "spark_outbox:migrations")
    # ConfigParser interpolation: a literal % in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    return cfg


def upgrade(
    url: str,
    revision: str = OUTBOX_HEAD,
    *,
    lock_timeout_s: float | None = None,
    tries: int = 1,
) -> None:
    """Migrate to ``revision`` while the previous release runs (docs/operations.md,
    "Upgrading").

    ``lock_timeout_s``: each statement waits at most this long for a lock. A revision's
    ALTER waiting for a long transaction would otherwise queue every dispatcher's
    claim and every commit behind it for as long as that transaction lasts. A wait
    that runs out, or a deadlock with the traffic, rolls back to the last committed
    revision and the upgrade tries again (``tries`` in all, pausing between tries)."""
    from alembic import command

    cfg = alembic_config(url)
    if lock_timeout_s:
        cfg.attributes["lock_timeout_ms"] = max(1, round(lock_timeout_s * 1000))
    for attempt in range(1, tries + 1):
        try:
            command.upgrade(cfg, revision)
            return
        except sa.exc.DBAPIError as exc:
            code = getattr(exc.orig, "pgcode", None)
            if code not in _LOCK_WAITS:
                raise
            if attempt == tries:
                raise UpgradeBlocked(
                    f"the upgrade gave up after {tries} tries: each {_LOCK_WAITS[code]} "
                    "(a long transaction holds a table it alters); run it again, or with "
                    "--lock-timeout-s 0 to wait as long as it takes (writers then queue "
                    "behind it)"
                ) from None
            log.warning(
                "upgrade: %s; trying again (%d of %d)",
                _LOCK_WAITS[code],
                attempt + 1,
                tries,
                extra={"event": "db.upgrade_retry", "attempt": attempt + 1, "pgcode": code},
            )
            time.sleep(min(0.2 * 2**attempt, 5.0) * random.uniform(0.5, 1.0))  # noqa: S311


def downgrade(url: str, revision: str) -> None:
    from alembic import command

    command.downgrade(alembic_config(url), revision)
