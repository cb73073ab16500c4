"""Recover: an endpoint's dead effects by when they died.

``outbox endpoints recover NAME --since ...`` requeues the dead effects of one
endpoint whose ``updated_at`` (the time they died) is after ``since``. Dead rows
are few, so the partial index is small.

Revision ID: 1403
Revises: 1402
Create Date: 2026-11-23 09:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1403"
down_revision = "1402"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_effects_dead_endpoint_updated_at",
        "effects",
        ["endpoint", "updated_at"],
        unique=False,
        postgresql_where=sa.text("state = 'dead'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_effects_dead_endpoint_updated_at",
        table_name="effects",
        postgresql_where=sa.text("state = 'dead'"),
    )
