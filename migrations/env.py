"""Alembic environment: the outbox schema (``dispatcher.schema``) and the example's
table (``spark_jobs.billing_schema``) are the targets, one branch each."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from dispatcher import schema
from dispatcher.db import terse_errors
from spark_jobs import billing_schema

config = context.config
if not config.get_main_option("sqlalchemy.url"):
    # Run from the `alembic` command line: DATABASE_URL names the database.
    import os

    from dispatcher.db import require_url, sqlalchemy_url

    url = require_url(os.environ.get("DATABASE_URL", ""))
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
target_metadata = [schema.metadata, billing_schema.metadata]


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
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
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
