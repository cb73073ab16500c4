"""Retention deletes finished effects; markers count them; the ledger gets a horizon.

A purge that kept a stub per effect wrote a new version of the row in every
index and never gave space back: at 10M effects a month's purge grew the
database by 4.4 GB (bench/RESULTS.md, "history"). Retention now deletes the
effect and its attempts; the key stays in ``key_ledger``; the batch marker
counts what left (``batches.effects_purged``, for reconciliation).

- ``batches.effects_purged``: NOT NULL with a constant default, no rewrite.
- ``ix_effects_stubs``: the stubs erasures and older releases left, which
  retention deletes too; built CONCURRENTLY (no lock on writers).
- ``ix_key_ledger_finished_at``: the ledger's horizon forgets keys oldest first;
  built CONCURRENTLY.

Online and expand-only: the previous release's code reads and writes what it
did (its purge still keeps stubs, which this release's purge deletes later; its
reconciliation does not know ``effects_purged`` and counts a deleted effect as
missing until its API is upgraded: docs/operations.md, "Deploy order").

Revision ID: 2772
Revises: 2771
Create Date: 2026-11-27 09:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "2772"
down_revision = "2771"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "batches",
        sa.Column("effects_purged", sa.BigInteger, nullable=False, server_default="0"),
        if_not_exists=True,  # committed before the indexes below: it may run again
    )
    with op.get_context().autocommit_block():
        op.create_index(
            "ix_effects_stubs",
            "effects",
            ["updated_at", "id"],
            postgresql_where=sa.text("purged_at IS NOT NULL"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )
        op.create_index(
            "ix_key_ledger_finished_at",
            "key_ledger",
            ["finished_at"],
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    op.drop_index("ix_key_ledger_finished_at", table_name="key_ledger")
    op.drop_index("ix_effects_stubs", table_name="effects")
    op.drop_column("batches", "effects_purged")
