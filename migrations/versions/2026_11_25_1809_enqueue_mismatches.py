"""enqueue()'s payload mismatches, kept where status and metrics can count them.

A key enqueued again with another payload keeps its first payload (idempotency);
the sink counts such rows on its batch marker, but ``enqueue()`` only told its
caller. Each one is now a row here (key, endpoint, both hashes, when): no
payload, no recipient, nothing personal. /v1/status lists the last day's,
/metrics counts them with the sink's, and retention drops rows older than its
horizon.

Revision ID: 1809
Revises: 1525
Create Date: 2026-11-25 18:09:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "1809"
down_revision = "1525"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "enqueue_mismatches",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("at", pg.TIMESTAMP(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("idempotency_key", sa.Text, nullable=False),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("stored_sha256", sa.Text, nullable=False),
        sa.Column("offered_sha256", sa.Text, nullable=False),
    )
    op.create_index("ix_enqueue_mismatches_at", "enqueue_mismatches", ["at"])


def downgrade() -> None:
    op.drop_table("enqueue_mismatches")
