"""Retention: purged effect stubs, and a key ledger that knows every finished key.

- ``effects.purged_at``: retention replaced the payload with ``{}`` and deleted
  the attempts; the row stays (key, state, timestamps, batch) as a stub.
- ``ix_effects_purgeable``: finished, not yet purged rows by finish time; the
  purge walks it in small batches.
- ``key_ledger.state`` (delivered, dead, cancelled) and ``finished_at``; a
  delivered row still has ``delivered_at``, other states leave it NULL.

Revision ID: 1402
Revises: 1401
Create Date: 2026-11-23 09:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1402"
down_revision = "1401"
branch_labels = None
depends_on = None

PURGEABLE = "purged_at IS NULL AND state IN ('delivered', 'dead', 'cancelled')"


def upgrade() -> None:
    op.add_column("effects", sa.Column("purged_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_effects_purgeable",
        "effects",
        ["updated_at", "id"],
        unique=False,
        postgresql_where=sa.text(PURGEABLE),
    )
    op.add_column(
        "key_ledger",
        sa.Column("state", sa.Text(), server_default="delivered", nullable=False),
    )
    op.add_column(
        "key_ledger",
        sa.Column(
            "finished_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=True,
        ),
    )
    op.execute("UPDATE key_ledger SET finished_at = delivered_at")
    op.alter_column("key_ledger", "finished_at", nullable=False)
    op.alter_column("key_ledger", "delivered_at", nullable=True)
    op.create_check_constraint(
        op.f("ck_key_ledger_state"), "key_ledger", "state IN ('delivered', 'dead', 'cancelled')"
    )
    op.create_check_constraint(
        op.f("ck_key_ledger_delivered_has_delivered_at"),
        "key_ledger",
        "state <> 'delivered' OR delivered_at IS NOT NULL",
    )


def downgrade() -> None:
    op.execute("DELETE FROM key_ledger WHERE state <> 'delivered'")
    op.drop_constraint(op.f("ck_key_ledger_delivered_has_delivered_at"), "key_ledger")
    op.drop_constraint(op.f("ck_key_ledger_state"), "key_ledger")
    op.alter_column("key_ledger", "delivered_at", nullable=False)
    op.drop_column("key_ledger", "finished_at")
    op.drop_column("key_ledger", "state")
    op.drop_index("ix_effects_purgeable", table_name="effects", postgresql_where=sa.text(PURGEABLE))
    op.drop_column("effects", "purged_at")
