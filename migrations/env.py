"""Alembic environment: the schema of ``dispatcher.schema`` is the target."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from dispatcher.schema import metadata

config = context.config
if not config.get_main_option("sqlalchemy.url"):
    # Run from the `alembic` CLI: same database the application would use.
    from dispatcher.db import database_url, sqlalchemy_url
    from dispatcher.settings import Settings

    config.set_main_option(
        "sqlalchemy.url", sqlalchemy_url(database_url(Settings.from_env())).replace("%", "%%")
    )
target_metadata = metadata


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
        connectable = engine_from_config(
            config.get_section(config.config_ini_section, {}),
            prefix="sqlalchemy.",
            poolclass=pool.NullPool,
        )
    with connectable.connect() as connection:
        context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
