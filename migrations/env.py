"""Alembic environment: the outbox schema (``spark_outbox.core.schema``) is the target.

The example job's table (``invoices``) has a branch of its own here (``billing``) but
its description belongs to the example (``spark_outbox.billing.schema``), which the
migrations do not import: autogenerate and ``alembic check`` leave tables that are not
the outbox's alone."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from spark_outbox.core import schema
from spark_outbox.core.db import terse_errors

config = context.config
if not config.get_main_option("sqlalchemy.url"):
    # Run from the `alembic` command line: DATABASE_URL names the database.
    import os

    from spark_outbox.core.db import require_url, sqlalchemy_url

    url = require_url(os.environ.get("DATABASE_URL", ""))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
target_metadata = schema.metadata


def include_object(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    """Compare the outbox's own tables only (not the example's, not a user's)."""
    return not (type_ == "table" and reflected and compare_to is None)


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        include_object=include_object,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is None:
        connectable = terse_errors(
            engine_from_config(
                config.get_section(config.config_ini_section, {}),
                prefix="sqlalchemy.",
                poolclass=pool.NullPool,
                hide_parameters=True,  # as every engine of the project
            )
        )
    with connectable.connect() as connection:
        lock_timeout_ms = config.attributes.get("lock_timeout_ms")
        if lock_timeout_ms:  # spark_outbox.core.db.upgrade: bounded waits for locks
            connection.exec_driver_sql(f"SET lock_timeout = {int(lock_timeout_ms)}")
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            include_object=include_object,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
