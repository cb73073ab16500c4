"""``effects.reference``: the business reference a customer quotes (an invoice number).

Optional and indexed (partial: only rows that carry one), ending in the audit
keyset ``(created_at, id)`` like the other audit indexes, so a search by
reference pages without a sort.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("effects", sa.Column("reference", sa.Text(), nullable=True))
    op.create_index(
        op.f("ix_effects_reference_created_at_id"),
        "effects",
        ["reference", "created_at", "id"],
        unique=False,
        postgresql_where=sa.text("reference IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        op.f("ix_effects_reference_created_at_id"),
        table_name="effects",
        postgresql_where=sa.text("reference IS NOT NULL"),
    )
    op.drop_column("effects", "reference")
