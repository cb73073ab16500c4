"""Attempts per minute kept as they are logged: status's throughput and chart no
longer count the attempt log.

"Delivered in the last hour" and the chart's attempts per minute (up to 24 h)
counted ``delivery_attempts`` rows: 76 ms for the last hour after 90,000
deliveries (bench/RESULTS.md, "history"), and a day at 1,000 deliveries/s is
86M rows. ``attempt_counts`` holds one row per (minute, outcome) an INSERT into
the attempt log wrote (a statement trigger, objects/counts.sql); the
dispatchers fold it and drop minutes older than the chart's longest range.

Online and expand-only, as 2770: the previous release's record fires the
trigger too; the last day of attempts is counted after the trigger exists, less
what it counted meanwhile (a range of ix_delivery_attempts_started_at).

Revision ID: 2773
Revises: 2772
Create Date: 2026-11-27 09:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from spark_outbox.core import objects

revision = "2773"
down_revision = "2772"
branch_labels = None
depends_on = None

_COUNT_THE_LAST_DAY = """
INSERT INTO attempt_counts (minute, outcome, n)
SELECT minute, outcome, sum(n) FROM (
    SELECT date_trunc('minute', started_at) AS minute, outcome, count(*) AS n
    FROM delivery_attempts WHERE started_at >= now() - interval '25 hours'
    GROUP BY 1, 2
    UNION ALL
    SELECT minute, outcome, -n FROM attempt_counts WHERE minute >= now() - interval '25 hours'
) d
GROUP BY minute, outcome
HAVING sum(n) <> 0
"""


def upgrade() -> None:
    op.create_table(
        "attempt_counts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("minute", pg.TIMESTAMP(timezone=True), nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("n", sa.BigInteger, nullable=False),
        if_not_exists=True,  # committed before the count below: it may run again
    )
    op.create_index("ix_attempt_counts_minute", "attempt_counts", ["minute"], if_not_exists=True)
    op.execute(objects.text("attempt_counts_inserted"))
    op.execute(objects.text("delivery_attempts_count_on_insert"))
    with op.get_context().autocommit_block():
        op.execute(_COUNT_THE_LAST_DAY)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS delivery_attempts_count_on_insert ON delivery_attempts")
    op.execute("DROP FUNCTION IF EXISTS attempt_counts_inserted()")
    op.drop_table("attempt_counts")
