"""Steps of an online revision that are easy to get wrong (migrations/README.md).

``create_index_concurrently``: an index on a table that exists, built while the
previous release keeps writing to it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


def create_index_concurrently(
    name: str,
    table: str,
    columns: Sequence[str],
    *,
    where: str | None = None,
    unique: bool = False,
) -> None:
    """Build an index without blocking the table's writes, in an autocommit block of
    its own (CONCURRENTLY cannot run in a transaction: what the revision did before
    it is committed first, so those steps must be safe to run again).

    A build that was interrupted (a cancel, a lost connection, a unique violation)
    leaves an invalid index that ``IF NOT EXISTS`` would keep for ever: it is dropped
    first. No lock timeout while it builds: it waits for the transactions in flight,
    and the lock it holds meanwhile blocks no reader and no writer."""
    with op.get_context().autocommit_block():
        restore = None
        if not op.get_context().as_sql:  # online (offline SQL has no catalog to ask)
            bind = op.get_bind()
            if bind.execute(_INVALID, {"name": name}).scalar():
                op.execute(sa.text(f'DROP INDEX CONCURRENTLY "{name}"'))
            restore = bind.execute(sa.text("SELECT current_setting('lock_timeout')")).scalar()
            op.execute("SET lock_timeout = 0")
        try:
            op.create_index(
                name,
                table,
                list(columns),
                unique=unique,
                postgresql_where=sa.text(where) if where else None,
                postgresql_concurrently=True,
                if_not_exists=True,
            )
        finally:
            if restore is not None:
                op.get_bind().execute(
                    sa.text("SELECT set_config('lock_timeout', :value, false)"),
                    {"value": restore},
                )


_INVALID = sa.text(
    "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
    "WHERE c.relname = :name AND c.relnamespace = current_schema()::regnamespace"
)
