"""The queue's figures kept as the last full count found them, for backlogs.

Every ``/v1/status``, API scrape, dispatcher heartbeat and progress line counted
the due effects (in all and per endpoint): beside 1,000,000 due effects each
count took 185-238 ms of PostgreSQL, the status page two of them. Now a reader
counts at most ``queue.EXACT_UP_TO`` due effects; when there are fewer, that
count is the answer, exact and live, as before. Beyond, it reads
``queue_snapshot``: the figures of the last full count, taken by one reader at a
time (an advisory lock, never waited for) when the one there is older than the
reader's refresh interval (a dispatcher's heartbeat), and never used once older
than ``queue.SNAPSHOT_MAX_AGE_S``.

Online and expand-only: a new table, empty (the first reader beyond the cap
fills it). The previous release never reads it and goes on counting.

Revision ID: 2813
Revises: 2812
Create Date: 2026-12-07 05:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "2813"
down_revision = "2812"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_snapshot",
        sa.Column("id", sa.SmallInteger, nullable=False, autoincrement=False),
        sa.Column("figures", pg.JSONB, nullable=False),
        sa.Column("taken_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_queue_snapshot_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queue_snapshot")),
    )


def downgrade() -> None:
    op.drop_table("queue_snapshot")
