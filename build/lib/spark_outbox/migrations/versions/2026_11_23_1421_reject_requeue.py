"""Rejects that can be enqueued again: when, and as which key.

An effect rejected because its endpoint was not registered (a configuration
slip, not bad data) can be enqueued again once the endpoint exists
(``outbox rejects requeue``, ``POST /v1/rejects/requeue``). ``requeued_at``
says it was, so a second requeue skips it; the operator action records who and
why.

Revision ID: 1421
Revises: 1311
Create Date: 2026-11-23 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "1421"
down_revision = "1311"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("rejects", sa.Column("requeued_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("rejects", "requeued_at")
