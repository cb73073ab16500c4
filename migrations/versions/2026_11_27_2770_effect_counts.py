"""Effect counts kept as they change: /v1/status and /metrics no longer count the history.

A count of effects by state read every row of ``effects``: 4.2 s for /v1/status
at 10M effects. ``effect_counts`` holds one row per change (+n / -n per endpoint,
state and run), written by statement triggers on ``effects`` in the writer's own
transaction (objects/counts.sql); readers sum it, the dispatchers fold it.

Online and expand-only: a new table, functions and triggers. The previous
release's writers fire the triggers too (its dispatchers, sinks and API keep
the counts right without knowing them). The count of what was there before
runs after the triggers exist, in a transaction of its own that blocks no
writer: one statement counts the effects and subtracts the changes its snapshot
already sees, so nothing is counted twice and nothing is missed
(``count(effects) - counted changes`` then ``+ every change``).

Revision ID: 2770
Revises: 2721
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

from spark_outbox.core import objects

revision = "2770"
down_revision = "2721"
branch_labels = None
depends_on = None

# What this revision made of objects/counts.sql (the file holds later ones too).
_OBJECTS = (
    "effect_counts_inserted",
    "effect_counts_updated",
    "effect_counts_deleted",
    "effect_counts_truncated",
    "effects_count_on_insert",
    "effects_count_on_update",
    "effects_count_on_delete",
    "effects_count_on_truncate",
)

# The effects there before the triggers: their count less the changes the same
# snapshot already sees (those the triggers recorded since they were created).
_COUNT_THE_PAST = """
INSERT INTO effect_counts (endpoint, state, run_id, n)
SELECT endpoint, state, run_id, sum(n) FROM (
    SELECT endpoint, state, run_id, count(*) AS n FROM effects GROUP BY endpoint, state, run_id
    UNION ALL
    SELECT endpoint, state, run_id, -n FROM effect_counts
) d
GROUP BY endpoint, state, run_id
HAVING sum(n) <> 0
"""


def upgrade() -> None:
    op.create_table(
        "effect_counts",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("endpoint", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("run_id", pg.UUID(as_uuid=True)),
        sa.Column("n", sa.BigInteger, nullable=False),
        if_not_exists=True,  # committed before the count below: it may run again
    )
    for name in _OBJECTS:
        op.execute(objects.text(name))
    # The triggers commit first (CREATE TRIGGER waits for the writers in flight, so
    # every later write is counted); then the count of the past, in its own snapshot.
    with op.get_context().autocommit_block():
        op.execute(_COUNT_THE_PAST)


def downgrade() -> None:
    for event in ("insert", "update", "delete", "truncate"):
        op.execute(f"DROP TRIGGER IF EXISTS effects_count_on_{event} ON effects")
    for change in ("inserted", "updated", "deleted", "truncated"):
        op.execute(f"DROP FUNCTION IF EXISTS effect_counts_{change}()")
    op.drop_table("effect_counts")
